"""What the bucket advice declines to predict: groupings with buckets far larger than any the job all-reduced, and
fits whose per-byte time is lost in their noise."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from comm_heavy import COMM_HEAVY, MB, run

from dagtop.model import advice as advice_module
from dagtop.model import bucket_map, candidates
from dagtop.model import candidate as candidate_module
from dagtop.model.advice import Candidate, Kind, advise_snapshot
from dagtop.model.buckets import BucketModel
from dagtop.model.snapshot import Snapshot


def _window(snap: Snapshot, model: BucketModel) -> candidate_module.Window:
    """The advice's window over ``snap`` with ``model`` as its bucket model (its fit as the window's)."""
    window = advice_module.window_of(snap.iterations)
    identity = statistics.median(a.predicted_ms for a in window)
    return candidate_module.Window(tuple(window), identity, identity, 2, model.comm, tuple(
        b for b in map(bucket_map.backward_of, window) if b is not None), model.layout, model)


def test_buckets_far_larger_than_any_timed_are_not_advised() -> None:
    """A grouping with a bucket over REACH times the largest bucket all-reduced rests on a per-byte time the fit never
    measured (caches: benchmarks/allreduce_sizes.py): it is named, not advised. Where it alone would gain, the bucket
    advice is withheld with the reason, not a 'keep the buckets'; where a grouping within reach gains too, that one is
    advised and the larger one said."""
    snap = run(dataclasses.replace(COMM_HEAVY, bucket_limits=(1,)))  # a bucket per block: 2 to 8 MiB
    model = advise_snapshot(snap).buckets
    assert model is not None and model.comm.largest == 8 * MB and not model.now.beyond
    for g in model.tried:  # DDP's default makes a 30-MiB bucket
        assert g.beyond == (max(bucket_map.totals(model.layout.sizes, g.counts)) > 16 * MB)
    far = next(g for g in model.tried if g.beyond)
    near = next(g for g in model.tried if not g.beyond and not g.extrapolated and g.counts != model.layout.now)
    identity = statistics.median(a.predicted_ms for a in advice_module.window_of(snap.iterations))

    def advised(shares: dict[int, float]) -> Candidate:
        tried = tuple(dataclasses.replace(g, step_ms=(shares.get(id(g), 1.0) * identity,) * len(g.step_ms),
                                          bounds_ms=(shares.get(id(g), 1.0) * identity,) * 2) for g in model.tried)
        now = dataclasses.replace(model.now, step_ms=(identity,) * len(model.now.step_ms))
        chosen, = candidates._buckets(_window(snap, dataclasses.replace(model, now=now, tried=tried)))
        return chosen

    withheld = advised({id(far): 0.8})
    assert withheld.confidence is advice_module.Confidence.WITHHELD and far.label.split(" (")[0] in withheld.doubt
    assert "per-byte time the fit never saw" in withheld.doubt and "keep" not in withheld.title
    chosen = advised({id(far): 0.7, id(near): 0.85})
    assert chosen.setting == dict(near.setting) and chosen.speedup == pytest.approx(1 / 0.85)
    assert "per-byte time the fit never saw" in chosen.evidence and "not advised" in chosen.evidence
    assert "keep" in advised({}).title  # nothing gains, larger or not


def test_no_bucket_size_is_weighed_where_the_per_byte_time_is_lost_in_the_noise() -> None:
    """A fit whose per-byte time is within MIN_T standard errors of 0 cannot tell the latency a merge saves from the
    per-byte cost: the bucket advice is withheld with that reason, where the same fit with a clear slope advises."""
    snap = run(dataclasses.replace(COMM_HEAVY, bucket_limits=(MB, 2 * MB)))
    advice = advise_snapshot(snap)
    model = advice.buckets
    assert model is not None and model.comm.b_ns_per_byte > candidates.MIN_T * model.comm.b_se
    assert any(c.kind is Kind.BUCKETS for c in advice.fixes)
    noisy = dataclasses.replace(model.comm, b_se=model.comm.b_ns_per_byte / 1.5)
    chosen, = candidates._buckets(_window(snap, dataclasses.replace(model, comm=noisy)))
    assert chosen.confidence is advice_module.Confidence.WITHHELD
    assert "do not grow with their size beyond their noise" in chosen.doubt
