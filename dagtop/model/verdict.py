"""The steady verdict: what held the job back over the recent iterations, said only as far as the window shows it.

One iteration's verdict flickers where two categories are close (compute 48 %, all-reduce 46 %) or where two
symmetric ranks take turns being last to a collective. The steady verdict looks at a window of the last
:data:`WINDOW` counted iterations (complete, past warm-up, not stalled: :func:`counts`):

- **gathering** until :data:`~dagtop.model.snapshot.GATHER` iterations are counted: no verdict from warm-up;
- the **bottleneck** is the category holding the most of the window's critical-path time, said alone only when
  it leads the runner-up beyond the window's own spread: the per-iteration difference of their shares has a
  95 % interval (of its median, :func:`~dagtop.model.stats.median_interval`) above zero, and the window's shares
  differ by :data:`LEAD` at least. Otherwise the two are a **tie** (``compute ≈ all-reduce``). A bottleneck said
  alone stays so while the 80 % interval is above zero and the lead half of :data:`LEAD`, so that it does not
  flicker at the threshold. A sliding window cannot jump from one category said alone to another:
  the intervals of two windows one iteration apart overlap, so the tie comes in between;
- the **straggler** is named on evidence by :func:`dagtop.model.straggler.decide` (a sign test with a correction
  across ranks and for the noise's dependence, and a minimum effect, over a window that lasts 2 s at least), and
  marked on the same iterations' per-rank rows, so the ranks table, the rank picker and the headline say the same.

The pipeline folds it forward as iterations are analysed (:func:`fold`) and stores it on each analysis, so a
paused or browsed screen shows the verdict as it stood at that iteration, and a replay the same as live. An iteration
analysed again when its late frame comes gets its verdict again, and so does the newest (which now counts it); those
in between keep the verdict they had when they were analysed: a rank's backlog of a thousand late frames must not
cost a thousand re-folds of everything after each.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import Final

from dagtop.model import straggler
from dagtop.model.snapshot import GATHER, IterationAnalysis, SteadyVerdict
from dagtop.model.stats import median_interval

WINDOW: Final = 20
"""Iterations the steady verdict looks back over."""
HISTORY: Final = straggler.HISTORY_SPANS * straggler.LONGEST
"""Counted iterations the straggler test may look back over: the window it judges (longer than :data:`WINDOW` where
steps are fast, :func:`dagtop.model.straggler.span`) and those before it, where it measures the noise's dependence."""
TIE_CONFIDENCE: Final = 0.95
"""A bottleneck is said alone when its lead's interval at this confidence is above zero..."""
KEEP_CONFIDENCE: Final = 0.80
"""...and stays alone while its interval at this confidence is."""
LEAD: Final = 0.05
"""...and when its share of the window leads the runner-up's by this much (it stays alone down to half of it):
a lead of two points, however regular, is no bottleneck to act on rather than its runner-up."""


def counts(a: IterationAnalysis) -> bool:
    """Whether an iteration counts towards the verdict: complete, not empty, past warm-up, not stalled."""
    return a.complete and a.measured_ms > 0 and not a.in_warm_up and not a.stalled


def fold(analyses: Sequence[IterationAnalysis], start: int, end: int | None = None) -> list[IterationAnalysis]:
    """``analyses[start:end]`` (oldest first) with their steady verdicts, each from the one before it."""
    out = []
    previous = analyses[start - 1].steady if start > 0 else None
    counted: deque[IterationAnalysis] = deque(maxlen=HISTORY)
    for a in reversed(analyses[:start]):
        if len(counted) == HISTORY:
            break
        if counts(a):
            counted.appendleft(a)
    for a in analyses[start:end]:
        if counts(a):
            counted.append(a)
        history = list(counted)
        steady = advance(previous, history[-WINDOW:], history)
        out.append(_with(a, steady))
        previous = steady
    return out


def _with(a: IterationAnalysis, steady: SteadyVerdict) -> IterationAnalysis:
    """``a`` with its steady verdict, and its per-rank rows marking the verdict's straggler (only)."""
    named = steady.straggler.rank if steady.straggler is not None else None
    rows = a.per_rank
    if any(row.straggler != (row.rank == named) for row in rows):
        rows = tuple(row if row.straggler == (row.rank == named) else dataclasses.replace(row, straggler=not row.straggler)
                     for row in rows)
    if steady == a.steady and rows is a.per_rank:
        return a
    return dataclasses.replace(a, steady=steady, per_rank=rows)


def shares(window: Sequence[IterationAnalysis]) -> dict[str, float]:
    """Category → fraction of the window's critical-path time (each iteration weighed by its time)."""
    totals: dict[str, float] = {}
    for a in window:
        for category, share in a.shares.items():
            totals[category] = totals.get(category, 0.0) + share * a.measured_ms
    whole = sum(totals.values()) or 1.0
    return {c: t / whole for c, t in totals.items()}


def advance(previous: SteadyVerdict | None, window: Sequence[IterationAnalysis],
            history: Sequence[IterationAnalysis] = ()) -> SteadyVerdict:
    """The verdict over ``window`` (counted iterations, oldest first), given the one before it; ``history``, the
    counted iterations up to the window's last, is where the straggler test takes a window that lasts long enough
    and measures the noise's dependence (:func:`dagtop.model.straggler.decide`)."""
    if len(window) < GATHER:
        return SteadyVerdict(len(window), "", 0.0, None)
    share = shares(window)
    ranked = sorted(share, key=lambda c: (-share[c], c))
    leader = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    tied = None
    if runner is not None:
        lead = [a.shares.get(leader, 0.0) - a.shares.get(runner, 0.0) for a in window]
        alone = previous is not None and previous.bottleneck == leader and previous.tied_with is None
        low, _ = median_interval(lead, KEEP_CONFIDENCE if alone else TIE_CONFIDENCE)
        margin = share[leader] - share[runner]
        if low <= 0 or margin < (LEAD / 2 if alone else LEAD):
            tied = runner
            if previous is not None and (previous.bottleneck, previous.tied_with) == (runner, leader):
                leader, tied = runner, leader  # the same tie: keep its order while the two cross
    kept = previous.straggler if previous is not None else None
    return SteadyVerdict(len(window), leader, share.get(leader, 0.0), straggler.decide(window, kept, history), tied,
                         share.get(tied, 0.0) if tied is not None else 0.0)
