"""The live screen on a real balanced 2-rank job, watched in tmux for more than a minute: its headline never names
a straggler and never flips between two categories said alone (a tie comes between), and it said something."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import time
import uuid

import pytest
from ranks import start_job
from test_ui_tmux import _capture, _private_tmux_server, _wait_for, tmux  # noqa: F401 - the fixture is autouse

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

WATCHED_S = 65.0
"""How long the headline is read after the first verdict (no longer gathering)."""
START_S = 180.0
"""Generous: two torch ranks start slowly on a loaded 2-core machine."""


def _headline(screen: str) -> str:
    lines = screen.splitlines()
    return lines[1] if len(lines) > 1 else ""


def _said(headline: str) -> tuple[str, bool] | None:
    """(the bottleneck, whether it is a tie) as the headline says it; None while gathering."""
    if headline.startswith("gathering") or "critical path" not in headline and "≈" not in headline:
        return None
    if "≈" in headline.split("·")[0]:
        return headline.split("≈")[0].strip(), True
    found = re.match(r"(.+?) on the critical path", headline)
    return (found.group(1).strip(), False) if found else None


def test_a_balanced_jobs_headline_names_no_straggler_and_never_flips(endpoint: str) -> None:
    session = f"dagtop-live-{uuid.uuid4().hex[:8]}"
    command = "env -u COLUMNS -u LINES " + shlex.join([sys.executable, "-m", "dagtop", "--bind", endpoint])
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", f"{command}; echo DAGTOP-EXIT=$?; sleep 30")
    _wait_for(session, "waiting for", START_S)  # bound before the ranks start: none of their frames is lost
    job = start_job("steady.py", "--seconds", str(WATCHED_S + 60), endpoint=endpoint)
    try:
        deadline = time.monotonic() + START_S
        said = _said(_headline(_capture(session)))
        while said is None:
            assert time.monotonic() < deadline, f"no verdict; the screen:\n{_capture(session)}"
            time.sleep(0.5)
            said = _said(_headline(_capture(session)))
        seen: list[str] = []
        end = time.monotonic() + WATCHED_S
        while time.monotonic() < end:
            seen.append(_headline(_capture(session)))
            time.sleep(0.5)
        assert all(p.poll() is None for p in job.procs), "the job ended before the minute was up"
    finally:
        tmux("send-keys", "-t", session, "q")
        _wait_for(session, "DAGTOP-EXIT=", START_S)
        run = job.wait(START_S)
    assert run.ok, run.log[-2000:]
    verdicts = [(h, _said(h)) for h in seen]
    silent = [h for h, v in verdicts if v is None]
    assert len(silent) <= 0.1 * len(seen), silent[:3]  # the screen said something
    assert not [h for h in seen if "straggler rank" in h], [h for h in seen if "straggler rank" in h][:3]
    alone = [v[0] if not v[1] else None for _, v in verdicts if v is not None]
    flips = [(a, b) for a, b in zip(alone, alone[1:]) if a is not None and b is not None and a != b]
    assert not flips, flips
