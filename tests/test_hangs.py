"""Hangs with their holder, in a real 2-rank gloo DDP job (tests/jobs/hang.py): rank 1 asleep in its loader (a live
rank, still sending heartbeats) and rank 1 frozen by SIGSTOP. The holder is named on the screen's line within
10 s past the stall threshold, on the monitor's own clock (the frames' arrival times, replayed as the live screen
judged them); ``report --json`` lists the stall at the iteration where it happened, kept out of the verdict."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.waits import JOB_WAIT_S
from ranks import RunningJob, start_job

from dagtop.commands.cli import main
from dagtop.io.recording import RecordingWriter
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from instrument import wire

pytestmark = pytest.mark.slow

NAMED_WITHIN_S = 10.0
"""The holder must be on screen this soon after the stall threshold is passed."""


def _wait(condition: Any, what: str, job: RunningJob) -> None:
    deadline = time.monotonic() + JOB_WAIT_S
    while not condition():
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in job.procs):
            raise AssertionError(f"{what}: not within {JOB_WAIT_S:g} s; job log:\n{job.log.read_text()[-3000:]}")
        time.sleep(0.2)


def _first_named(frames: list[RawFrame], said: str) -> tuple[int, str, float] | None:
    """Replay the frames as the live screen judged them: the monitor time at which the line first said ``said``,
    the line, and the stall threshold then."""
    pipeline = Pipeline()
    for raw in frames:
        pipeline.feed([raw])
        line = pipeline.liveness.view.line()
        if said in line:
            return raw.received_ns, line, pipeline.liveness.threshold_s()
    return None


@pytest.mark.parametrize(("hang", "said"), [("loader", "rank 1 holds the job: in loader next for "),
                                            ("stop", "rank 1 holds the job: silent ")])
def test_the_holder_of_a_hang_is_named_and_the_stall_reported_at_its_iteration(
        hang: str, said: str, endpoint: str, collector: Any, tmp_path: Path, capsys: Any) -> None:
    job = start_job("hang.py", "--hang", hang, "--at", "8", "--seconds", "14", endpoint=endpoint)
    hang_file = job.out / "hang.json"
    try:
        _wait(hang_file.exists, "rank 1 hangs", job)
        if hang == "stop":
            _wait(lambda: _first_named(list(collector.frames), said) is not None, "rank 1 named the holder", job)
            time.sleep(3)  # stopped a while longer, then continued
            job.signal(1, signal.SIGCONT)
        run = job.wait()
    finally:
        job.signal(1, signal.SIGCONT)
        job.wait(5)
    assert run.ok, run.log[-3000:]
    at = json.loads(hang_file.read_text())
    frames = list(collector.frames)
    found = _first_named(frames, said)
    assert found is not None, "the holder was never named"
    named_ns, line, threshold_s = found
    assert "rank 0 waiting in all-reduce bucket " in line, line
    assert (named_ns - at["at_ns"]) / 1e9 <= threshold_s + NAMED_WITHIN_S, (named_ns - at["at_ns"]) / 1e9

    path = tmp_path / "hang.dagtop"
    with RecordingWriter(path) as writer:
        for raw in frames:
            writer.append(raw)
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [stall] = report["stalls"]
    assert (stall["iteration"], stall["confirmed"], stall["resumed"]) == (at["iteration"], True, True), stall
    assert [h["rank"] for h in stall["holders"]] == [1] and stall["duration_s"] >= 5, stall
    assert [w["ranks"] for w in stall["waiting"]] == [[0]] and stall["waiting"][0]["task"].startswith("all-reduce")
    assert report["stalled_iterations"] == 1
    # The 14-s iteration is a stall, not the job's steady state: io does not become the bottleneck from it.
    assert report["bottleneck"] != "io" and report["critical_path"]["io"] < 0.5, report["critical_path"]
    hellos = {f.rank for f in (wire.decode(r.payload) for r in frames) if isinstance(f, wire.Hello)}
    assert hellos == {0, 1}
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"stall            iteration {at['iteration']}: no iteration for " in text
    assert "rank 1 held the job" in text and "rank 0 waiting in all-reduce bucket" in text
