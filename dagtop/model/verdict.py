"""The steady verdict: what held the job back over the recent iterations, with hysteresis so it holds still.

One iteration's verdict flickers where two categories are close (compute 48 %, all-reduce 46 %) or where two
symmetric ranks take turns being last to a collective. The steady verdict looks at a window of recent
iterations and changes its mind only for a clear reason:

- the bottleneck is the category holding the most critical-path time over the window; a challenger takes over
  only when its share leads the incumbent's by more than ``SWITCH_MARGIN``;
- a straggler is named only when it was the iteration's straggler in more than ``NAME_SHARE`` of a window of
  at least ``NAME_AFTER`` iterations, and stays named while that stays above ``KEEP_SHARE``.

The pipeline folds it forward as iterations are analysed (:func:`fold`) and stores it on each analysis, so a
paused or browsed screen shows the verdict as it stood at that iteration, and a replay the same as live.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence

from dagtop.model.snapshot import IterationAnalysis, SteadyStraggler, SteadyVerdict

WINDOW = 20
"""Iterations the steady verdict looks back over."""
SWITCH_MARGIN = 0.05
"""A challenger category replaces the bottleneck when its share of the window's critical path is this much higher."""
NAME_SHARE = 0.6
"""A rank is named the straggler when it was late in more than this fraction of the window..."""
NAME_AFTER = 5
"""...of at least this many iterations (two ranks taking turns are late 2 in 3 by chance)..."""
KEEP_SHARE = 0.4
"""...and stays named while it is late in more than this fraction."""


def counts(a: IterationAnalysis) -> bool:
    """Whether an iteration counts towards the verdict: complete, not empty, past warm-up."""
    return a.complete and a.measured_ms > 0 and not a.in_warm_up


def fold(analyses: Sequence[IterationAnalysis], start: int) -> list[IterationAnalysis]:
    """``analyses[start:]`` (oldest first) with their steady verdicts, each from the one before it."""
    out = []
    previous = analyses[start - 1].steady if start > 0 else None
    for j in range(start, len(analyses)):
        window: list[IterationAnalysis] = []
        for a in reversed(analyses[: j + 1]):
            if counts(a):
                window.append(a)
                if len(window) == WINDOW:
                    break
        window.reverse()
        steady = advance(previous, window) if len(window) >= 2 else previous
        out.append(analyses[j] if steady is analyses[j].steady else _with(analyses[j], steady))
        previous = steady
    return out


def _with(a: IterationAnalysis, steady: SteadyVerdict | None) -> IterationAnalysis:
    return dataclasses.replace(a, steady=steady)


def advance(previous: SteadyVerdict | None, window: Sequence[IterationAnalysis]) -> SteadyVerdict:
    """The verdict over ``window`` (oldest first), given the one before it."""
    totals: dict[str, float] = {}
    for a in window:
        for category, share in a.shares.items():
            totals[category] = totals.get(category, 0.0) + share * a.measured_ms
    whole = sum(totals.values()) or 1.0
    shares = {c: t / whole for c, t in totals.items()}
    bottleneck = max(shares, key=lambda c: shares[c])
    if previous is not None and shares[bottleneck] - shares.get(previous.bottleneck, 0.0) <= SWITCH_MARGIN:
        bottleneck = previous.bottleneck
    late = Counter(a.straggler.rank for a in window if a.straggler is not None)
    rank = None
    kept = previous.straggler if previous is not None else None
    if kept is not None and late[kept.rank] > KEEP_SHARE * len(window):
        rank = kept.rank
    if rank is None and late and len(window) >= NAME_AFTER:
        top, count = late.most_common(1)[0]
        if count > NAME_SHARE * len(window):
            rank = top
    straggler = None
    if rank is not None:
        mine = [a.straggler for a in window if a.straggler is not None and a.straggler.rank == rank]
        straggler = SteadyStraggler(rank, Counter(s.category for s in mine).most_common(1)[0][0], len(mine),
                                    statistics.median(s.busy_excess_ms for s in mine))
    return SteadyVerdict(len(window), bottleneck, shares.get(bottleneck, 0.0), straggler)
