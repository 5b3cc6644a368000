"""What the advisor's tests share (tests/test_advice.py, test_advice_accumulation.py): a communication-heavy
synthetic job and its analysis."""

from __future__ import annotations

import statistics

from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import Snapshot
from dagtop.model.synthetic import SyntheticJob, synthetic_frames

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
