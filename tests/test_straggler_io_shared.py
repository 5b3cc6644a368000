"""A loader straggler on CPU cores that other ranks of the job share: its 'straggler at median' advice keeps its
figure but lowers its confidence, with the reason (the ranks beside it compute with the CPU it leaves while it
waits); on GPU ranks the same job's advice is not put in doubt. And the advice names a straggler of fast steps
(its window of 50 iterations lasting under the 2 s the rule asks), from the iterations before, as the live
verdict does."""

from __future__ import annotations

import dataclasses

from dagtop.model.advice import Kind, advise
from dagtop.model.candidate import Candidate, Confidence
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire

SLOW_LOADER = SyntheticJob(ranks=3, slow_ranks=(1,), slow_category="io", slow_factor=4.0)
"""Rank 1 waits four times longer for its batches than ranks 0 and 2 (~27-ms steps), all three on one host."""


def straggler(device: str) -> Candidate:
    p = Pipeline(window=None)
    for raw in synthetic_frames(SLOW_LOADER, iterations=120, seed=5):
        frame = wire.decode(raw.payload)
        if isinstance(frame, wire.Hello) and device != "cpu":
            raw = RawFrame(raw.received_ns, wire.encode(dataclasses.replace(frame, device=device)))
        p.feed([raw])
    p.finish()
    snap = p.snapshot()
    assert 40 * 50 > sum(a.measured_ms for a in snap.iterations[-50:])  # the advice's window lasts under 2 s
    advice = advise(snap.iterations, snap.ranks, snap.buckets, snap.telemetry)
    [c] = [c for c in advice.fixes if c.kind is Kind.STRAGGLER]
    return c


def test_a_loader_straggler_on_shared_cpu_cores_is_advised_in_doubt_and_says_why() -> None:
    c = straggler("cpu")
    assert c.title == "rank 1 to the median" and c.throughput is not None and c.throughput > 1.1
    assert c.confidence is Confidence.LOWER
    assert c.doubt.startswith("rank 1 waits for its data on the cores of host") and "ranks 0, 2 compute" in c.doubt


def test_on_gpu_ranks_the_same_loader_straggler_is_not_put_in_doubt_for_it() -> None:
    c = straggler("cuda:0")
    assert c.title == "rank 1 to the median" and c.throughput is not None and c.throughput > 1.1
    assert "waits for its data" not in c.doubt
