"""What the advisor's tests share (tests/test_advice*.py): a communication-heavy synthetic job, its analysis, and
the training threads' CPU times CPU ranks would send with it."""

from __future__ import annotations

import dataclasses
import statistics

from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import Snapshot
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire

MB = 1 << 20


def run(job: SyntheticJob, iterations: int = 40) -> Snapshot:
    p = Pipeline(window=None)
    p.feed(synthetic_frames(job, iterations))
    p.finish()
    return p.snapshot()


def measured(job: SyntheticJob) -> float:
    return statistics.median(a.measured_ms for a in run(job).iterations[1:])


COMM_HEAVY = SyntheticJob(blocks=8, block_bytes=[2 * MB, 4 * MB, 8 * MB, 4 * MB, 6 * MB, 4 * MB, 8 * MB, 2 * MB],
                          backward_ms=40, forward_ms=20, io_ms=1, allreduce_ms_per_mb=1.0, allreduce_alpha_ms=0.5,
                          jitter=0.02)
"""Eight blocks of 2 to 8 MiB whose all-reduces take about as long as their backward: DDP's default buckets are
2, 30 and 6 MiB, the last 36 MiB all-reduced after most of the backward is over."""


def with_thread_cpu(snap: Snapshot, work_ms: float, share: float, ranks: tuple[int, ...] | None = None,
                    shim_ms: float = 0.0, launch_ms: float = 0.0) -> Snapshot:
    """``snap`` with each rank's training thread said to have done ``work_ms`` of CPU work in each iteration besides
    its update and its loader's 1 ms, its update's CPU time ``share`` of the update's wall clock, ``shim_ms`` of
    it in dagtop's hooks and ``launch_ms`` in DDP's launches of its all-reduces."""
    cpus: dict[int, dict[int, wire.ThreadCpu]] = {}
    for a in snap.iterations:
        for r in a.ranks if ranks is None else ranks:
            update = int(share * sum(t.duration_ns for t in a.tasks.by_rank[r] if t.phase == "update"))
            cpus.setdefault(a.iteration, {})[r] = wire.ThreadCpu(int(work_ms * 1e6) + update + 1_000_000, update,
                                                                 1_000_000, int(shim_ms * 1e6), int(launch_ms * 1e6))
    return dataclasses.replace(snap, thread_cpu=cpus)
