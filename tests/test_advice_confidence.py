"""A prediction is said validated only where the job lies inside the conditions its kind's re-runs met the target in
(dagtop.model.trust); anywhere else it is of lower confidence, with the reason that applies to this job."""

from __future__ import annotations

import dataclasses

from comm_heavy import COMM_HEAVY, run, with_thread_cpu

from dagtop.model.advice import Candidate, Confidence, Kind, advise_snapshot
from dagtop.model.snapshot import Snapshot
from dagtop.model.trust import DOUBT
from instrument import wire
from instrument.wire_fields import HostStats


def of(snap: Snapshot, kind: Kind) -> Candidate:
    advice = advise_snapshot(snap)
    return next(c for c in (*advice.fixes, *advice.little) if c.kind is kind)


def cpu_job(**changes: object) -> Snapshot:
    """COMM_HEAVY changed by ``changes``, with the training threads' CPU times CPU ranks send."""
    job = dataclasses.replace(COMM_HEAVY, **changes)  # type: ignore[arg-type]
    return with_thread_cpu(run(job), job.forward_ms + job.backward_ms, 1.0)


def test_accumulation_is_validated_only_on_even_cpu_ranks_of_long_backward_tasks_and_a_large_gain() -> None:
    """Each condition the re-runs missed in lowers the confidence on its own and is named: short backward tasks
    (mostly per-operator CPU work), a rank computing slower than the rest, a gain under 10 %, a GPU."""
    inside = of(cpu_job(), Kind.ACCUMULATION)
    assert (inside.confidence, inside.doubt) == (Confidence.VALIDATED, "")
    assert inside.throughput is not None and inside.throughput > 1.2

    short = of(cpu_job(backward_ms=3.2, forward_ms=2.0), Kind.ACCUMULATION)  # 8 blocks: 0.4 ms a backward task
    assert short.confidence is Confidence.LOWER
    assert "its backward's tasks are short (0.40 ms each on average)" in short.doubt

    uneven = of(cpu_job(slow_ranks=(1,), slow_category="compute", slow_factor=1.5), Kind.ACCUMULATION)
    assert uneven.confidence is Confidence.LOWER
    assert uneven.doubt.startswith("rank 1 computes ") and "short" not in uneven.doubt

    small = of(cpu_job(allreduce_ms_per_mb=0.2, allreduce_alpha_ms=0.1), Kind.ACCUMULATION)
    assert small.throughput is not None and 1.02 < small.throughput < 1.10
    assert small.confidence is Confidence.LOWER and small.doubt.startswith("a gain under 10 %")

    gpu = of(cpu_job(device="cuda:0"), Kind.ACCUMULATION)
    assert (gpu.confidence, gpu.doubt) == (Confidence.LOWER, DOUBT[Kind.ACCUMULATION])


def test_a_regrouping_is_validated_where_gloo_takes_little_of_the_backward_and_a_keep_never() -> None:
    """A grouping's gain on CPU ranks whose gloo threads take the backward's CPU is mostly that CPU given back, the
    part of the bucket model its re-runs missed; a keep claims only that nothing gains 10 %."""
    link = with_thread_cpu(run(COMM_HEAVY), 60.0, 1.0)  # gloo's threads report no CPU time: nothing taken
    regroup = of(link, Kind.BUCKETS)
    assert regroup.setting and (regroup.confidence, regroup.doubt) == (Confidence.VALIDATED, "")

    [host] = {r.host for r in link.ranks}
    busy = dataclasses.replace(link, thread_cpu={i: {r: c._replace(others_ns=30_000_000) for r, c in ranks.items()}
                                                 for i, ranks in link.thread_cpu.items()},
                               telemetry=(wire.Telemetry(0, 0, host, 0, 0, HostStats(90.0, 2, 1, 2), None),))
    stealing = of(busy, Kind.BUCKETS)
    assert stealing.setting and stealing.confidence is Confidence.LOWER
    assert stealing.doubt.startswith("gloo's threads take ")

    keep = of(with_thread_cpu(run(dataclasses.replace(COMM_HEAVY, allreduce_ms_per_mb=0.2)), 60.0, 1.0), Kind.BUCKETS)
    assert not keep.setting and keep.title.startswith("keep")
    assert keep.confidence is Confidence.LOWER and keep.doubt.startswith("a keep claims only")
