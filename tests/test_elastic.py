"""An elastic restart under real torchrun (``--max-restarts 1``), rank 1 killed with ``kill -9`` mid-run: every
iteration of every incarnation is in the recording, ``record`` counts each complete iteration once, ``report
--json`` lists the restart as a second run numbered on from the first, and the screen says it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.waits import WAIT_S
from test_ui_helpers import fake_telemetry, wait_loaded

from dagtop.demo.launch import free_port
from dagtop.io.recording import read_recording
from dagtop.io.sources import RecordingSource
from dagtop.ui.app import make_app
from dagtop.ui.widgets.verdict import Verdict
from instrument import wire

pytestmark = pytest.mark.slow

JOBS = Path(__file__).parent / "jobs"
STEPS = 150
KILLED_AFTER = 40
"""Steps rank 1 of the first incarnation has finished when it is killed (at least)."""


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wait(condition, what: str, timeout_s: float = 4 * WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.timeout(900)  # two incarnations of torchrun's job, on a loaded machine: past the suite's 300 s
def test_an_elastic_restart_keeps_both_runs_and_says_so(tmp_path: Path, endpoint: str) -> None:
    recording, out = tmp_path / "elastic.dagtop", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "JOB_OUT": str(out), "DAGTOP_ENDPOINT": endpoint, "DAGTOP_TELEMETRY": "0",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(JOBS)}
    env.pop("DAGTOP_DISABLE", None)
    recorder = subprocess.Popen([sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o",
                                 str(recording), "--timeout", str(4 * WAIT_S)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--max-restarts", "3", "--master-port", str(free_port()), "--monitor-interval", "0.5",
                            str(JOBS / "paced.py"), "--steps", str(STEPS), "--step-ms", "40"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: _lines(out / "steps-0-1") >= KILLED_AFTER, "the first incarnation's steps")
        os.kill(int((out / "pid-0-1").read_text()), signal.SIGKILL)
        assert job.wait(8 * WAIT_S) == 0, "torchrun did not finish the job after restarting it"
        _, err = recorder.communicate(timeout=4 * WAIT_S)  # it stops when every rank of the last run said bye
    finally:
        for proc in (job, recorder):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc is job else proc.kill()
                proc.wait()
    assert recorder.returncode == 0, err
    # The incarnations that trained (gloo's rendezvous of a restarted incarnation fails now and then on a loaded
    # machine: torchrun then starts another, which is what --max-restarts is for).
    incarnations = sorted({int(p.name.split("-")[1]) for p in out.glob("pid-*")})
    last = incarnations[-1]
    assert incarnations[0] == 0 and last >= 1
    ran = {(k, rank): _lines(out / f"steps-{k}-{rank}") for k in incarnations for rank in (0, 1)}
    assert ran[(last, 0)] == ran[(last, 1)] == STEPS and KILLED_AFTER <= ran[(0, 1)] < STEPS, ran

    # Every iteration each process finished is in the recording, under its own process; but for the one killed: what
    # its publisher had not sent yet went with it (a few on a busy machine, whose shim threads run niced), and is
    # counted below.
    frames = [wire.decode(raw.payload) for raw in read_recording(recording)]
    pids = {(k, rank): int((out / f"pid-{k}-{rank}").read_text()) for k in incarnations for rank in (0, 1)}
    hellos = {f.sender: f for f in frames if isinstance(f, wire.Hello)}
    assert {(h.restart, h.rank): h.pid for h in hellos.values()} == pids
    recorded: dict[tuple[int, int], set[int]] = {key: set() for key in pids}  # its iterations in the recording
    for f in frames:
        if isinstance(f, wire.IterationBatch):
            recorded[(hellos[f.sender].restart, f.rank)].add(f.iteration)
    for key, steps in ran.items():
        if key == (0, 1):
            assert recorded[key] == set(range(len(recorded[key]))) and recorded[key], key
        else:
            assert set(range(steps)) <= recorded[key], key

    # Each complete iteration counted once: those both ranks of an incarnation published (a rank killed between
    # its step and the line it writes after may have published one more than it said, or, its publisher behind,
    # fewer: the frames that went with it).
    both = {k: recorded[(k, 0)] & recorded[(k, 1)] for k in incarnations}
    assert len(both[0]) >= min(ran[(0, 0)], len(recorded[(0, 1)])) and len(both[last]) == STEPS
    summary = err.strip().splitlines()[-1]
    complete = sum(len(b) for b in both.values())
    assert f" {complete} complete iterations" in summary and f"{len(incarnations)} runs (restarted)" in summary, \
        summary

    report = subprocess.run([sys.executable, "-m", "dagtop", "report", "--json", str(recording)],
                            capture_output=True, text=True, timeout=4 * WAIT_S)
    assert report.returncode == 0, report.stderr
    s = json.loads(report.stdout)
    runs = s["runs"]
    assert [r["restart"] for r in runs] == incarnations
    for before, run in zip(runs, runs[1:]):  # numbered on, each run from the last iteration of the one before
        k = run["restart"]
        assert run["pids"] == [pids[(k, 0)], pids[(k, 1)]]
        assert before["last_iteration"] == before["first_iteration"] + max(recorded[(before["restart"], 0)]
                                                                           | recorded[(before["restart"], 1)])
        assert run["after_iteration"] == before["last_iteration"] and run["first_iteration"] == before[
            "last_iteration"] + 1
        assert run["said"].startswith(f"restart {k} at ") and run["said"].endswith(
            f", after iteration {run['after_iteration']}")
    assert runs[-1]["last_iteration"] == runs[-1]["first_iteration"] + STEPS - 1
    assert s["rejected"] == 0 and s["iterations"] == complete - len(incarnations)  # each run warms up in its first
    # What never came is counted: the iterations a run went through whose frame from a rank is not there.
    missing = sum(max(recorded[(k, 0)] | recorded[(k, 1)]) + 1 - len(recorded[(k, rank)])
                  for k in incarnations for rank in (0, 1))
    assert s["lost"]["iterations_missing"] == missing and s["lost"]["before_connect"] == 0, s["lost"]

    # The screen says it (replayed to its end, within a minute of the restart).
    app = make_app(RecordingSource(recording, speed=0), sampler=fake_telemetry, source_label="replay")
    said: list[str] = []
    expected = runs[-1]["said"]

    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(pilot, app)
            for _ in range(600):
                said[:] = [str(app.query_one(Verdict).render().renderables[0])]  # type: ignore[attr-defined]
                if expected in said[0]:
                    break
                await pilot.pause(0.05)

    asyncio.run(main())
    assert expected in said[0], said
