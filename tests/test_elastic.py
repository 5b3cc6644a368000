"""An elastic restart under real torchrun (``--max-restarts 1``), rank 1 killed with ``kill -9`` mid-run: every
iteration of both incarnations is in the recording, ``record`` counts each complete iteration once, ``report
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
from conftest import WAIT_S
from test_ui_helpers import fake_telemetry, wait_loaded

from dagtop.demo.launch import free_port
from dagtop.recording import read_recording
from dagtop.sources import RecordingSource
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


def test_an_elastic_restart_keeps_both_runs_and_says_so(tmp_path: Path, endpoint: str) -> None:
    recording, out = tmp_path / "elastic.dagtop", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "JOB_OUT": str(out), "DAGTOP_ENDPOINT": endpoint, "DAGTOP_TELEMETRY": "0",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(JOBS)}
    env.pop("DAGTOP_DISABLE", None)
    recorder = subprocess.Popen([sys.executable, "-m", "dagtop.cli", "record", "--bind", endpoint, "-o",
                                 str(recording), "--timeout", str(4 * WAIT_S)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--max-restarts", "1", "--master-port", str(free_port()), "--monitor-interval", "0.5",
                            str(JOBS / "paced.py"), "--steps", str(STEPS), "--step-ms", "40"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: _lines(out / "steps-0-1") >= KILLED_AFTER, "the first incarnation's steps")
        os.kill(int((out / "pid-0-1").read_text()), signal.SIGKILL)
        assert job.wait(8 * WAIT_S) == 0, "torchrun did not finish the job after one restart"
        _, err = recorder.communicate(timeout=4 * WAIT_S)  # it stops when every rank of the new run said bye
    finally:
        for proc in (job, recorder):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc is job else proc.kill()
                proc.wait()
    assert recorder.returncode == 0, err
    ran = {(restart, rank): _lines(out / f"steps-{restart}-{rank}") for restart in (0, 1) for rank in (0, 1)}
    assert ran[(1, 0)] == ran[(1, 1)] == STEPS and KILLED_AFTER <= ran[(0, 1)] < STEPS, ran

    # Every iteration each process finished is in the recording, under its own process.
    frames = [wire.decode(raw.payload) for raw in read_recording(recording)]
    pids = {(restart, rank): int((out / f"pid-{restart}-{rank}").read_text()) for restart in (0, 1) for rank in (0, 1)}
    hellos = {f.sender: f for f in frames if isinstance(f, wire.Hello)}
    recorded: dict[tuple[int, int], set[int]] = {}  # (restart, rank) -> its iterations in the recording
    for f in frames:
        if isinstance(f, wire.IterationBatch):
            recorded.setdefault((hellos[f.sender].restart, f.rank), set()).add(f.iteration)
    assert {key: hellos_pid for key, hellos_pid in ((key, pids[key]) for key in pids)} == {
        (h.restart, h.rank): h.pid for h in hellos.values()}
    for key, steps in ran.items():
        assert set(range(steps)) <= recorded[key], key

    # Each complete iteration counted once: those both ranks of a run published (a rank killed between its step
    # and the line it writes after may have published one more than it said).
    both = [recorded[(restart, 0)] & recorded[(restart, 1)] for restart in (0, 1)]
    assert len(both[0]) >= min(ran[(0, 0)], ran[(0, 1)]) and len(both[1]) == STEPS
    summary = err.strip().splitlines()[-1]
    assert f" {len(both[0]) + STEPS} complete iterations" in summary and "2 runs (restarted)" in summary, summary

    report = subprocess.run([sys.executable, "-m", "dagtop.cli", "report", "--json", str(recording)],
                            capture_output=True, text=True, timeout=4 * WAIT_S)
    assert report.returncode == 0, report.stderr
    s = json.loads(report.stdout)
    first, second = s["runs"]
    assert (first["restart"], second["restart"]) == (0, 1) and second["pids"] == [pids[(1, 0)], pids[(1, 1)]]
    assert second["after_iteration"] == max(recorded[(0, 0)] | recorded[(0, 1)])
    assert second["first_iteration"] == second["after_iteration"] + 1
    assert second["last_iteration"] == second["first_iteration"] + STEPS - 1
    assert second["said"].startswith("restart 1 at ") and second["said"].endswith(
        f", after iteration {second['after_iteration']}")
    assert s["rejected"] == 0 and s["iterations"] == len(both[0]) + STEPS - 2  # each run warms up in its first

    # The screen says it (replayed to its end, within a minute of the restart).
    app = make_app(RecordingSource(recording, speed=0), sampler=fake_telemetry, source_label="replay")
    said: list[str] = []

    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(pilot, app)
            for _ in range(600):
                said[:] = [str(app.query_one(Verdict).render().renderables[0])]  # type: ignore[attr-defined]
                if "restart 1 at" in said[0]:
                    break
                await pilot.pause(0.05)

    asyncio.run(main())
    assert f"restart 1 at {second['said'].split(' at ')[1]}" in said[0], said
