"""The steady verdict: the window's bottleneck and straggler, and the hysteresis that keeps them still."""

from __future__ import annotations

import dataclasses
import itertools
import random

from test_ui_helpers import two_rank_iteration

from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import IterationAnalysis, SteadyVerdict, Straggler
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.model.verdict import WINDOW, fold


def iterations(shares: list[dict[str, float]], late: list[int | None] | None = None,
               measured_ms: float = 100.0) -> list[IterationAnalysis]:
    base = two_rank_iteration()
    late = late or [None] * len(shares)
    return [dataclasses.replace(base, iteration=i, measured_ms=measured_ms, shares=s,
                                bottleneck=max(s, key=s.__getitem__),
                                straggler=Straggler(r, "compute", 30.0, 20.0 + i) if r is not None else None)
            for i, (s, r) in enumerate(zip(shares, late), start=1)]


def steady(analyses: list[IterationAnalysis]) -> list[SteadyVerdict | None]:
    return [a.steady for a in fold(analyses, 0)]


def test_the_window_weighs_each_iteration_by_its_time_and_skips_warm_up() -> None:
    base = two_rank_iteration()
    warm = dataclasses.replace(base, iteration=0, measured_ms=1000.0, shares={"io": 1.0})
    comm = dataclasses.replace(base, iteration=1, measured_ms=100.0, shares={"allreduce": 0.6, "compute": 0.4})
    comp = dataclasses.replace(base, iteration=2, measured_ms=50.0, shares={"allreduce": 0.4, "compute": 0.6})
    # all-reduce: 60 + 20 = 80 ms of 150; compute 70 ms; iteration 0's io is warm-up.
    first, second, third = steady([warm, comm, comp])
    assert first is None and second is None  # one iteration is no trend
    assert third is not None and (third.bottleneck, third.iterations) == ("allreduce", 2)
    assert abs(third.share - 80 / 150) < 1e-9


def test_close_categories_taking_turns_do_not_flip_the_verdict() -> None:
    """A symmetric job, as issue #11 saw it: compute and all-reduce within a few points, each iteration's
    leader changing every few iterations. The steady verdict holds still."""
    rng = random.Random(7)
    shares = []
    for _ in range(200):
        c = 0.485 + rng.uniform(-0.04, 0.04)
        shares.append({"compute": c, "allreduce": 0.97 - c, "other": 0.03})
    its = iterations(shares)
    assert sum(x.bottleneck != y.bottleneck for x, y in itertools.pairwise(its)) > 50
    assert len({v.bottleneck for v in steady(its) if v is not None}) == 1


def test_a_clear_change_is_followed_within_the_window() -> None:
    compute, comm = {"compute": 0.8, "allreduce": 0.2}, {"compute": 0.2, "allreduce": 0.8}
    verdicts = steady(iterations([compute] * 30 + [comm] * 30))
    assert all(v.bottleneck == "compute" for v in verdicts[1:30])  # type: ignore[union-attr]
    switched = next(i for i, v in enumerate(verdicts) if v is not None and v.bottleneck == "allreduce")
    assert 30 < switched <= 30 + WINDOW // 2  # as soon as all-reduce leads by more than the margin
    assert all(v.bottleneck == "allreduce" for v in verdicts[switched:])  # type: ignore[union-attr]


def test_a_straggler_is_named_only_when_consistently_late_and_kept_while_it_mostly_is() -> None:
    shares = [{"compute": 0.9, "other": 0.1}] * 40
    # Two symmetric ranks taking turns: never named.
    assert all(v is None or v.straggler is None for v in steady(iterations(shares, [i % 2 for i in range(40)])))
    # Rank 1 late 3 times in 4: named, with the share of iterations and the median busy excess.
    v = steady(iterations(shares, [1 if i % 4 else 0 for i in range(40)]))[-1]
    assert v is not None and v.straggler is not None
    assert (v.straggler.rank, v.straggler.late, v.iterations, v.straggler.category) == (1, 15, 20, "compute")
    assert v.straggler.busy_excess_ms == sorted(20.0 + i for i in range(21, 41) if (i - 1) % 4)[7]
    # Once named it stays while late in more than 40 % of the window, though not the 60 % needed to be named.
    fading = steady(iterations(shares, [1] * 20 + [1 if i % 2 else None for i in range(20)]))
    assert all(v is not None and v.straggler is not None for v in fading[4:])
    fresh = steady(iterations(shares, [None] * 20 + [1 if i % 2 else None for i in range(20)]))
    assert all(v is None or v.straggler is None for v in fresh)


def test_the_pipeline_stores_each_iterations_verdict_and_keeps_it_as_the_window_slides() -> None:
    frames = synthetic_frames(SyntheticJob(ranks=4, slow_ranks=(2,), slow_category="compute"), iterations=60)
    whole, sliding = Pipeline(window=None), Pipeline(window=WINDOW + 5)
    whole.feed(frames)
    sliding.feed(frames)
    last = sliding.analyses()[-1]
    assert last.steady is not None and last.steady.straggler is not None and last.steady.straggler.rank == 2
    assert last.steady.bottleneck == "compute" and last.steady.iterations == WINDOW
    assert last.steady == whole.analyses()[-1].steady
