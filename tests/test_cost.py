"""Fix against buy, checked against figures worked out by hand."""

from __future__ import annotations

import dataclasses
import doctest

import pytest
from test_ui_helpers import two_rank_iteration

from dagtop.model import cost as cost_module
from dagtop.model.advice import Advice, Candidate, Kind
from dagtop.model.change import Change
from dagtop.model.cost import CostTerms, Epoch, epoch_cost, epoch_of, fix_or_buy, scaled, waste
from dagtop.model.snapshot import Segment, WhatIf
from instrument.wire_fields import Loader

LOADER = Loader(workers=0, batch_size=32, batches=500, prefetch_factor=None, pin_memory=0, persistent_workers=0)


def test_doctests() -> None:
    assert doctest.testmod(cost_module).failed == 0


def test_the_epoch_from_the_samples_or_the_loaders_length() -> None:
    # 1 000 000 samples at 32 per rank on 2 ranks: 64 a step, 15 625 steps.
    e = epoch_of(CostTerms(epoch_samples=1_000_000), LOADER, 2)
    assert isinstance(e, Epoch) and e.steps == 15_625 and "32 per rank × 2 ranks" in e.source
    # --batch-size wins over the loader's; 1 000 001 samples need one more (partial) step.
    assert epoch_of(CostTerms(epoch_samples=1_000_001, batch_size=50), LOADER, 2) == Epoch(
        10_001, "--epoch-samples 1000001 at 50 per rank × 2 ranks")
    assert epoch_of(CostTerms(), LOADER, 2) == Epoch(500, "the DataLoader's length (500 batches per rank)")
    assert "--epoch-samples" in str(epoch_of(CostTerms(), None, 2))
    assert "--batch-size" in str(epoch_of(CostTerms(epoch_samples=10), None, 2))


def test_an_epoch_now_and_with_a_change() -> None:
    # 15 625 steps of 250 ms: 3906.25 s = 1.0851 h; on 2 GPUs 2.1701 GPU-h; at $3: $6.51.
    now = epoch_cost(250.0, 15_625, 2, 3.0)
    assert now.hours == pytest.approx(1.085069, rel=1e-5)
    assert now.gpu_hours == pytest.approx(2.170139, rel=1e-5) and now.dollars == pytest.approx(6.510417, rel=1e-5)
    # A fix worth ×1.25 samples/s: 0.8 of the time, GPU-hours and dollars.
    fix = scaled(now, 1.25, 1, 3.0)
    assert (fix.hours, fix.gpu_hours, fix.dollars) == pytest.approx((0.868056, 1.736111, 5.208333), rel=1e-5)
    # Twice the GPUs at ×1.6 samples/s (80 % efficiency): 1/1.6 the time, 2/1.6 = 1.25 (the 1/E premium) the cost.
    more = scaled(now, 1.6, 2, 3.0)
    assert more.hours == pytest.approx(now.hours / 1.6) and more.gpu_hours == pytest.approx(now.gpu_hours * 1.25)
    assert scaled(now, 1.6, 2, None).dollars is None


def test_the_waste_counts_each_cause_alone_over_the_ranks_that_waited() -> None:
    """Three 100 ms iterations on 2 ranks, each with 10 ms of exposed communication and 20 ms of loading on the
    path: 600 rank-ms in all (1.667e-4 GPU-h), 60 of communication, 120 of loading, no straggler."""
    base = two_rank_iteration()
    path = (Segment(0, "io", "load", "next", 0, 20_000_000), Segment(0, "compute", "forward", "net", 20_000_000,
                                                                      100_000_000))
    its = [dataclasses.replace(base, iteration=i, measured_ms=100.0, exposed_comm_ms=10.0, critical_path=path,
                               straggler=None) for i in (1, 2, 3)]
    w = waste(its, None)
    assert w.iterations == 3 and w.gpu_hours == pytest.approx(600 / 3.6e6)
    assert w.communication == pytest.approx(60 / 3.6e6) and w.loading == pytest.approx(120 / 3.6e6)
    assert w.straggler == 0


def test_the_straggler_waste_is_the_verdicts_replay_of_its_rank_at_the_median() -> None:
    """Two 100 ms iterations (replayed 100 ms) on 2 ranks whose 'straggler at median' replay of rank 1 reads 80 ms:
    20 ms × 2 ranks each, 80 rank-ms; a replay of another rank, or no straggler named, counts nothing."""
    base = two_rank_iteration()
    at_median = WhatIf(Change.STRAGGLER_AT_MEDIAN, 80.0, 1.25, rank=1)
    its = [dataclasses.replace(base, iteration=i, measured_ms=100.0, predicted_ms=100.0, what_if=(at_median,))
           for i in (1, 2)]
    assert waste(its, 1).straggler == pytest.approx(80 / 3.6e6)
    assert waste(its, 0).straggler == 0 and waste(its, None).straggler == 0


def test_each_candidate_is_priced_against_now() -> None:
    fix = Candidate(Kind.BUCKETS, "bucket_cap_mb=8", "", {"bucket_cap_mb": 8}, 200.0, (190.0, 210.0), 1.25)
    buy = Candidate(Kind.SCALE_OUT, "4 workers (2N)", "", {}, 312.5, (300.0, 320.0), 0.8, workers=2)
    advice = Advice(20, 20, 250.0, 0.0, "", (fix,), (buy,))
    ranks = [dataclasses.replace(r, loader=LOADER) for r in _ranks()]
    priced = fix_or_buy(advice, [two_rank_iteration()], ranks, CostTerms(gpu_hour_price=3.0,
                                                                         epoch_samples=1_000_000))
    assert priced.epoch is not None and priced.epoch.steps == 15_625
    assert priced.now is not None and priced.now.dollars == pytest.approx(6.510417, rel=1e-5)
    (c1, e1), (c2, e2) = priced.rows
    assert c1 is fix and e1.dollars == pytest.approx(6.510417 / 1.25, rel=1e-5)
    # 2N at ×0.8 the step rate: ×1.6 throughput, 1.25× the GPU-hours.
    assert c2 is buy and e2.gpu_hours == pytest.approx(priced.now.gpu_hours * 2 / 1.6)
    held = fix_or_buy(dataclasses.replace(advice, held="too few"), [], ranks, CostTerms())
    assert held.now is None and not held.rows


def _ranks() -> list:  # type: ignore[type-arg]
    from dagtop.model.snapshot import RankInfo

    return [RankInfo(r, "h", 1, "cpu", "M", 1, 3, 0, 0, True) for r in (0, 1)]
