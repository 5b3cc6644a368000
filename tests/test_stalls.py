"""Hangs and deaths in a real 2-rank gloo DDP job (the demo): a rank stopped (SIGSTOP) is named silent while
the other waits in an all-reduce, and the job goes on after SIGCONT; a rank killed (kill -9) is gone; the job
started again (torchrun's restart: same ranks, new pids, iterations from 0) is restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.waits import JOB_WAIT_S

from dagtop.demo.launch import DemoJob, free_port
from dagtop.io.recording import read_recording
from dagtop.model.liveness_view import LivenessView
from dagtop.model.pipeline import Pipeline
from instrument import wire

pytestmark = pytest.mark.slow



class Monitor:
    """A pipeline fed from the collector's frames, judged on the monitor's clock as the live screen judges."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector
        self.pipeline = Pipeline()
        self._fed = 0

    def view(self) -> LivenessView:
        frames = list(self.collector.frames)
        self.pipeline.feed(frames[self._fed:])
        self._fed = len(frames)
        self.pipeline.expire(time.perf_counter_ns())
        return self.pipeline.liveness.view

    def wait_for(self, condition: Callable[[LivenessView], bool], what: str) -> LivenessView:
        deadline = time.monotonic() + JOB_WAIT_S
        while not condition(view := self.view()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {JOB_WAIT_S:g} s; last line: {view.line()!r}")
            time.sleep(0.2)
        return view


def _iterations(collector: Any, rank: int, pid: int | None = None) -> int:
    pids = {f.rank: f.pid for f in collector.decoded() if isinstance(f, wire.Hello)}
    return sum(1 for f in collector.decoded()
               if isinstance(f, wire.IterationBatch) and f.rank == rank and (pid is None or pids.get(rank) == pid))


def _pid(job: DemoJob, rank: int) -> int:
    return job._procs[rank].pid


def _signal(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # the rank and its DataLoader workers (each rank has its own group)
    except ProcessLookupError:
        pass


def test_a_stopped_rank_is_silent_the_other_waits_in_an_all_reduce_and_a_killed_one_is_gone(
        endpoint: str, collector: Any) -> None:
    job = DemoJob(endpoint, ranks=2)
    job.start()
    monitor = Monitor(collector)
    try:
        collector.wait_for(lambda frames: _iterations(collector, 0) >= 5 and _iterations(collector, 1) >= 5
                           and sum(isinstance(f, wire.Heartbeat) and f.rank == 1 for f in frames) >= 2,
                           "five iterations on each rank and heartbeats of rank 1", JOB_WAIT_S)
        rank1 = _pid(job, 1)
        _signal(rank1, signal.SIGSTOP)
        try:
            view = monitor.wait_for(lambda v: [r for r, _, _ in v.silent] == [1] and v.waiting,
                                    "rank 1 silent while rank 0 waits")
            [(task, waiting)] = view.waiting
            assert waiting == (0,) and task.startswith("all-reduce bucket "), view.line()
            assert "rank 1 holds the job: silent" in view.line() and "rank 0 waiting in all-reduce bucket" in view.line()
            assert view.silent[0][2], "rank 1's last heartbeat named where it was"
            done_before = _iterations(collector, 0)
        finally:
            _signal(rank1, signal.SIGCONT)
        # The job goes on: both ranks complete further iterations, and the stall is over.
        collector.wait_for(lambda frames: _iterations(collector, 0) >= done_before + 3, "iterations after SIGCONT",
                           JOB_WAIT_S)
        monitor.wait_for(lambda v: not v.stalled_s and all(x.resumed for x in monitor.pipeline.liveness.stalls),
                         "the stall over")
        [stall] = monitor.pipeline.liveness.stalls
        assert [h.rank for h in stall.holders] == [1] and stall.resumed and stall.holders[0].silent_s >= 3
        [(task, waiting)] = stall.waiting
        assert waiting == (0,) and task.startswith("all-reduce bucket ")

        _signal(rank1, signal.SIGKILL)
        view = monitor.wait_for(lambda v: (1, "process gone") in v.gone, "rank 1 gone")
        assert "rank 1 gone (process gone)" in view.line()
        assert (0, "process gone") not in view.gone
        # Not counted connected on the status line (rank 0 may be on its way out too: gloo sees the peer gone).
        assert 1 not in [r.rank for r in monitor.pipeline.snapshot().ranks if r.connected]
    finally:
        job.stop()


def test_a_job_started_again_is_shown_restarted(endpoint: str, collector: Any) -> None:
    # As torchrun starts a job again: the same run id and rendezvous, its restart count up.
    same = {"TORCHELASTIC_RUN_ID": "stalls", "MASTER_PORT": str(free_port())}
    first = DemoJob(endpoint, ranks=2, extra_env={**same, "TORCHELASTIC_RESTART_COUNT": "0"})
    first.start()
    monitor = Monitor(collector)
    try:
        collector.wait_for(lambda frames: _iterations(collector, 0) >= 5 and _iterations(collector, 1) >= 5,
                           "five iterations on each rank", JOB_WAIT_S)
        old = {rank: _pid(first, rank) for rank in (0, 1)}
        _signal(old[1], signal.SIGKILL)  # a rank dies; torchrun stops the others and starts them all again
    finally:
        first.stop()
    again = DemoJob(endpoint, ranks=2, extra_env={**same, "TORCHELASTIC_RESTART_COUNT": "1"})
    again.start()
    try:
        new = {rank: _pid(again, rank) for rank in (0, 1)}
        collector.wait_for(lambda frames: _iterations(collector, 1, new[1]) >= 2, "iterations of the new rank 1",
                           JOB_WAIT_S)
        view = monitor.wait_for(lambda v: {r.rank for r in v.restarted} == {0, 1}
                                and all(r.iteration is not None for r in v.restarted), "both ranks restarted")
        [_, run] = monitor.pipeline.snapshot().runs  # a new run, numbered on from the first one's last iteration
        assert run.restart == 1 and run.after is not None and run.first_iteration == run.after + 1
        assert {(r.rank, r.old_pid, r.new_pid, r.iteration) for r in view.restarted} == \
            {(rank, old[rank], new[rank], run.first_iteration) for rank in (0, 1)}
        assert "ranks 0-1 restarted" in view.line()
        assert "restart 1 at " in monitor.pipeline.snapshot().job_line
    finally:
        again.stop()


def _recorded_iterations(path: Any, rank: int) -> int:
    if not path.exists():
        return 0
    frames = [wire.decode(raw.payload) for raw in read_recording(path)]  # a tail being written is left out
    return sum(1 for f in frames if isinstance(f, wire.IterationBatch) and f.rank == rank)


def _heartbeats(path: Any, rank: int) -> int:
    if not path.exists():
        return 0
    frames = [wire.decode(raw.payload) for raw in read_recording(path)]
    return sum(1 for f in frames if isinstance(f, wire.Heartbeat) and f.rank == rank)


def test_dagtop_record_keeps_the_heartbeats_and_report_lists_the_stall(tmp_path: Any, endpoint: str) -> None:
    path = tmp_path / "stall.dagtop"
    recorder = subprocess.Popen([sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o", str(path),
                                 "--iterations", "1000000", "--timeout", str(JOB_WAIT_S)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    job = DemoJob(endpoint, ranks=2)
    job.start()
    rank1 = _pid(job, 1)
    try:
        deadline = time.monotonic() + JOB_WAIT_S
        while min(_recorded_iterations(path, 0), _recorded_iterations(path, 1)) < 5 or _heartbeats(path, 1) < 2:
            assert time.monotonic() < deadline and recorder.poll() is None, "five recorded iterations on each rank"
            time.sleep(0.2)
        _signal(rank1, signal.SIGSTOP)
        try:
            # Stopped for 8 s of rank 0's heartbeats (the recorder's clock is its frames' arrival times).
            stopped_at = _heartbeats(path, 0)
            while _heartbeats(path, 0) < stopped_at + 8:
                assert time.monotonic() < deadline + JOB_WAIT_S, "rank 0's heartbeats while rank 1 is stopped"
                time.sleep(0.2)
            done = _recorded_iterations(path, 0)
        finally:
            _signal(rank1, signal.SIGCONT)
        while _recorded_iterations(path, 0) < done + 3:
            assert time.monotonic() < deadline + 2 * JOB_WAIT_S, "iterations after SIGCONT"
            time.sleep(0.2)
    finally:
        job.stop()
        recorder.send_signal(signal.SIGINT)
        try:
            recorder.wait(JOB_WAIT_S)
        except subprocess.TimeoutExpired:
            recorder.kill()
            recorder.wait()
    report = subprocess.run([sys.executable, "-m", "dagtop", "report", "--json", str(path)], capture_output=True,
                            text=True, timeout=JOB_WAIT_S)
    assert report.returncode == 0, report.stderr
    stalls = json.loads(report.stdout)["stalls"]
    assert [([h["rank"] for h in x["holders"]], x["resumed"]) for x in stalls] == [([1], True)], stalls
    [stall] = stalls
    assert stall["holders"][0]["silent_s"] >= 5 and stall["iteration"] >= 5 and stall["holders"][0]["task"]
    [waiting] = stall["waiting"]
    assert waiting["ranks"] == [0] and waiting["task"].startswith("all-reduce bucket "), stall
    text = subprocess.run([sys.executable, "-m", "dagtop", "report", str(path)], capture_output=True, text=True,
                          timeout=JOB_WAIT_S)
    assert "rank 1 held the job (silent" in text.stdout and "rank 0 waiting in all-reduce bucket" in text.stdout
