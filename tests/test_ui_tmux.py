"""``dagtop replay`` in a real terminal (tmux): read the verdict, the ranks and the categories off the screen; q quits."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from test_ui_helpers import fixture

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


SOCKET = f"dagtop-test-{uuid.uuid4().hex[:8]}"
"""A private tmux server: other tmux users on the machine, and their options, stay out of the test."""


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], capture_output=True, text=True,
                          check=check)


def _capture(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session).stdout


def _wait_for(session: str, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = _capture(session)
        if needle in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never showed; the screen was:\n{screen}")


def test_replay_in_tmux_shows_verdict_ranks_and_categories_and_q_quits() -> None:
    session = f"dagtop-test-{uuid.uuid4().hex[:8]}"
    # COLUMNS/LINES (set by pytest and some shells) would override the pane size.
    command = "env -u COLUMNS -u LINES " + shlex.join([sys.executable, "-m", "dagtop.cli", "replay", str(fixture("straggler1-io")), "--speed", "0"])
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", f"{command}; echo DAGTOP-EXIT=$?; sleep 30")
    try:
        screen = _wait_for(session, "iteration 29", 30)  # the recording's last
        assert "io on the critical path" in screen
        assert "straggler rank 1 (io +" in screen
        for row in ("r0 main", "r0 comm", "r1 main", "r1 comm", "critical"):
            assert row in screen
        for category in ("io", "compute", "all-reduce", "pcie", "other"):
            assert f"■ {category}" in screen  # the legend with each share
        assert "ranks 2/2" in screen and "iteration 29" in screen
        tmux("send-keys", "-t", session, "q")
        assert "DAGTOP-EXIT=0" in _wait_for(session, "DAGTOP-EXIT=", 15)
    finally:
        tmux("kill-server", check=False)


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "expected"), [
    (["--bottleneck", "allreduce"], ["all-reduce on the critical path"]),
    (["--straggler", "1", "--bottleneck", "io"], ["io on the critical path", "straggler rank 1 (io +"]),
])
def test_demo_in_tmux_names_the_bottleneck_within_10_s_and_q_stops_the_job(flags: list[str],
                                                                            expected: list[str]) -> None:
    session = f"dagtop-demo-{uuid.uuid4().hex[:8]}"
    command = "env -u COLUMNS -u LINES " + shlex.join([sys.executable, "-m", "dagtop.cli", "demo", *flags])
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", f"{command}; echo DAGTOP-EXIT=$?; sleep 30")
    try:
        started = time.monotonic()
        deadline = started + 10
        while time.monotonic() < deadline:  # a verdict of one iteration may name the runner-up: any within 10 s
            screen = _capture(session)
            if all(e in screen for e in expected):
                break
            time.sleep(0.2)
        assert all(e in screen for e in expected), screen
        tmux("send-keys", "-t", session, "q")
        assert "DAGTOP-EXIT=0" in _wait_for(session, "DAGTOP-EXIT=", 20)
    finally:
        tmux("kill-server", check=False)
