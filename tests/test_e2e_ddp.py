"""End to end: a real 2-rank gloo DDP job (the demo) publishes every task of every iteration to a recorder."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dagtop.demo.launch import DemoJob, record_demo
from dagtop.io.recording import read_recording
from instrument import wire

pytestmark = pytest.mark.slow

BLOCKS = ["stem", "block1", "block2", "block3", "pool", "head"]
MS = 1_000_000
"""Slack for reading the thread's CPU clock just after a task's end stamp, on a loaded machine."""
MODEL = "DemoNet"


def _frames(path: Path) -> list[wire.Frame]:
    return [wire.decode(raw.payload) for raw in read_recording(path)]


def _iterations_in(frames: list[Any]) -> int:
    return sum(1 for f in list(frames) if isinstance(wire.decode(f.payload), wire.IterationBatch))


def test_every_complete_iteration_has_every_task_of_both_ranks(tmp_path: Path, endpoint: str) -> None:
    path = tmp_path / "run.dagtop"
    job = DemoJob(endpoint, ranks=2)
    assert record_demo(job, path, iterations=8) == 0
    frames = _frames(path)

    hellos = {f.rank: f for f in frames if isinstance(f, wire.Hello)}
    assert set(hellos) == {0, 1} and all(h.world == 2 and h.model == "DemoNet" for h in hellos.values())
    bucket_maps = {f.rank: f.buckets for f in frames if isinstance(f, wire.Buckets)}
    assert set(bucket_maps) == {0, 1} and bucket_maps[0] == bucket_maps[1]
    # The demo's gradients are its buckets (gradient_as_bucket_view): DDP copies none, so none is timed; the adds
    # of gradient accumulation are.
    assert all(f.copy_ns == 0 and f.add_ns > 0 for f in frames if isinstance(f, wire.Buckets))
    buckets = {f"bucket {b.index}": b.bytes for b in bucket_maps[0]}
    assert len(buckets) >= 2 and all(size > 0 for size in buckets.values())
    parameters = [p for b in bucket_maps[0] for p in b.parameters]
    assert sorted(parameters) == sorted(set(parameters)) and "head.weight" in parameters

    by_iteration: dict[int, dict[int, wire.IterationBatch]] = defaultdict(dict)
    for f in frames:
        if isinstance(f, wire.IterationBatch):
            by_iteration[f.iteration][f.rank] = f
    complete = [it for it, ranks in by_iteration.items() if set(ranks) == {0, 1}]
    assert len(complete) >= 8
    for it in complete:
        for rank, batch in by_iteration[it].items():
            events = batch.events
            phase = defaultdict(list)
            for e in events:
                phase[e.phase].append(e)
            where = f"iteration {it} rank {rank}"
            assert [(e.category, e.name, e.lane) for e in phase["load"]] == [("io", "next", "main")], where
            assert [(e.category, e.lane) for e in phase["h2d"]] == [("pcie", "main")], where
            assert phase["h2d"][0].bytes == 64 * 3 * 32 * 32 * 4 + 64 * 8, where
            # Any other forward or backward is the model's own work between its blocks (tests/test_spans.py).
            for name in ("forward", "backward"):
                assert {e.name for e in phase[name]} - set(BLOCKS) <= {MODEL}, where
            assert [e.name for e in phase["forward"] if e.name != MODEL] == BLOCKS, where
            assert sorted(e.name for e in phase["backward"] if e.name != MODEL) == sorted(BLOCKS), where
            assert [(e.category, e.name) for e in phase["update"]] == [("compute", "optimizer.step")], where
            allreduce = phase["allreduce"]
            assert all(e.category == "allreduce" and e.lane == "comm" and e.bytes > 0 for e in allreduce), where
            if it >= 2:  # buckets are rebuilt after iteration 0; the map describes them from iteration 1 on
                assert {e.name: e.bytes for e in allreduce} == buckets, where
            update = phase["update"][0]
            assert all(e.end_ns <= update.start_ns for e in allreduce), where  # DDP waits for every bucket
            # The training thread's CPU time (a CPU rank): its parts within it, none of it more than the wall clock.
            cpu = batch.thread_cpu
            assert cpu is not None and 0 < cpu.update_ns and 0 < cpu.load_ns and \
                cpu.update_ns + cpu.load_ns < cpu.total_ns, where
            assert cpu.update_ns <= update.end_ns - update.start_ns + MS, where
            assert cpu.load_ns <= phase["load"][0].end_ns - phase["load"][0].start_ns + MS, where
            assert cpu.shim_ns > 0, where  # the shim's own hooks, timed by the wall clock
            assert cpu.launch_ns > 0, where  # DDP's calls handing each bucket's all-reduce to gloo
            assert cpu.others_ns > 0, where  # gloo's threads, which reduce each bucket
            before = by_iteration.get(it - 1, {}).get(rank)
            if before is not None:  # from the last iteration's end to this one's, read just after its update
                since = update.end_ns - max(e.end_ns for e in before.events if e.phase == "update")
                assert cpu.total_ns <= since + MS and cpu.shim_ns + cpu.launch_ns < since, where
                assert cpu.others_ns <= (os.cpu_count() or 1) * (since + MS), where


def test_the_job_runs_to_the_end_with_no_monitor_listening(endpoint: str) -> None:
    job = DemoJob(endpoint, ranks=2, iterations=10)
    job.start()
    assert job.wait(240), job.log_tail()
    assert job.returncodes == [0, 0], job.log_tail()


def test_the_job_survives_a_monitor_that_goes_away(endpoint: str, make_collector: Any) -> None:
    collector = make_collector(endpoint)
    job = DemoJob(endpoint, ranks=2, iterations=60)
    job.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _iterations_in(collector.frames) < 10:
        time.sleep(0.1)
    frames = collector.stop()
    assert _iterations_in(frames) >= 10, job.log_tail()
    assert job.wait(240), job.log_tail()
    assert job.returncodes == [0, 0], job.log_tail()


def test_stop_ends_a_running_job_cleanly(endpoint: str, collector: Any) -> None:
    job = DemoJob(endpoint, ranks=2)
    job.start()
    try:  # both ranks in their training loop, however long a loaded machine takes to get them there
        collector.wait_for(lambda frames: {f.rank for f in frames if isinstance(f, wire.IterationBatch)} == {0, 1},
                           "an iteration from each rank", timeout_s=120)
    except AssertionError:
        job.stop()
        raise
    assert job.running
    codes = job.stop(timeout=60)
    assert not job.running
    assert codes == [0, 0], job.log_tail()
