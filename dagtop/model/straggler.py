"""The straggler, named only on evidence: the one rule behind the verdict, the ranks table's ◀, the rank picker and
``dagtop report``.

A rank's **excess** in an iteration is its busy time (io + pcie + compute: work, not waiting) minus the median of the
other ranks'. In synchronous SGD every rank's iteration takes the same wall time, the early ones waiting in a
collective, so the difference shows in the work done. Over a window of iterations a rank is named when:

1. **the sign test says it is not chance**: it was above the others in k of the window's n iterations (ties left
   out), and the one-sided p-value P(Binomial(n, ½) ≥ k), multiplied by the number of ranks (Bonferroni: every
   rank had its chance), is at most :data:`NAME_ALPHA`. With two ranks one of them is above the other in half of
   the iterations by chance, and above it in 12 of 20 with probability 0.25: a share of "late" iterations is no
   evidence; 19 of 20 is (p = 2·10⁻⁵, 4·10⁻⁵ for either rank). The level is strict because the live verdict asks
   again at every iteration, a few hundred times an hour: at 2·10⁻⁴ a balanced job of 60 iterations watched live
   gets a name in under 1 % of runs (tests/test_straggler.py simulates it), and a straggler above the others in
   every iteration is named from its 14th (two ranks; 15th with four). Noise on a shared machine is not
   independent from one iteration to the next (a rank starved of CPU for a few seconds is above the others for a
   run of iterations), which would fool the test more often than its p-value says: n and k are first shrunk to
   their effective size, n (1 − ρ) / (1 + ρ), with ρ the lag-1 autocorrelation of the signs it counts (pooled over
   the ranks and the recent iterations, :func:`_serial`);
2. **the effect is large enough to act on, with confidence**: the lower end of the 95 % interval of its median
   excess is at least :func:`min_effect` (5 % of the window's median iteration, and at least 1 ms): a rank whose
   excess stays small is not named however regular it is.

A named rank is **kept** while it still passes a weaker test (p ≤ :data:`KEEP_ALPHA` and a median excess of at
least the minimum effect), so that the name does not flicker at the threshold; but keeping it needs evidence too:
a rank above the others in 12 of 20 iterations is dropped.

The excess is reported as the median over **every** iteration of the window with its distribution-free 95 %
interval (order statistics of the binomial), never over a chosen subset: ``+35 ms [28, 41]``. The category is the
one of io, pcie and compute whose own excess has the largest median over the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from dagtop.model.snapshot import IterationAnalysis, SteadyStraggler
from dagtop.model.stats import effective_size, median_interval, sign_test
from dagtop.model.table import F64

NAME_ALPHA: Final = 2e-4
"""The chance, per window, of naming some rank of a job where none is slower (Bonferroni over the ranks)."""
KEEP_ALPHA: Final = 0.05
"""A named rank is kept while its corrected p-value stays at or below this."""
MIN_EFFECT_SHARE: Final = 0.05
"""An excess smaller than this fraction of the iteration is not worth naming..."""
MIN_EFFECT_MS: Final = 1.0
"""...nor one below this many ms."""
CONFIDENCE: Final = 0.95
"""Coverage of the excess's interval."""
WORK: Final = ("io", "pcie", "compute")
"""The categories a rank spends working; its waits for the others fall in 'other' and 'allreduce'."""


def min_effect(window: Sequence[IterationAnalysis]) -> float:
    """The smallest excess worth naming over ``window``: :data:`MIN_EFFECT_SHARE` of its median iteration time,
    at least :data:`MIN_EFFECT_MS`."""
    return max(MIN_EFFECT_MS, MIN_EFFECT_SHARE * float(np.median([a.measured_ms for a in window])))


@dataclass(frozen=True, slots=True)
class RankEvidence:
    """What a window says of one rank."""

    rank: int
    above: int
    """Iterations in which its busy time was above the other ranks' median."""
    iterations: int
    """Iterations in which it was above or below (ties left out)."""
    p_value: float
    """The sign test's one-sided p-value, multiplied by the number of ranks (at most 1)."""
    excess_ms: float
    """Median of its excess over every iteration of the window."""
    excess_range_ms: tuple[float, float]
    """The median's :data:`CONFIDENCE` interval."""
    serial: float = 0.0
    """The serial correlation of the signs (:func:`_serial`, ≥ 0) that shrank the sign test's sample to its
    effective size."""


def evidence(window: Sequence[IterationAnalysis], history: Sequence[IterationAnalysis] = ()) -> list[RankEvidence]:
    """Every rank's evidence over ``window`` (oldest first), the most suspect first (smallest p-value, then the
    largest median excess). A rank missing from an iteration is left out of that iteration.

    Args:
        history: a longer run of counted iterations ending with the window, to estimate the serial correlation
            from (20 values of two ranks, the ones of the window, say little of it); default the window.
    """
    ranks = sorted({row.rank for a in window for row in a.per_rank})
    if len(ranks) < 2 or not window:
        return []
    rho = _serial(history if len(history) > len(window) else window, ranks)
    excess = _excess(window, ranks)
    if np.isnan(excess).any():  # a rank missing from some iterations: each rank over the iterations it has
        columns = [np.sort(excess[:, j][~np.isnan(excess[:, j])]) for j in range(len(ranks))]
    else:
        columns = list(np.sort(excess, axis=0).T)
    above = (excess > 0).sum(axis=0)
    below = (excess < 0).sum(axis=0)
    out = []
    for j, r in enumerate(ranks):
        values = columns[j]
        if not len(values):
            continue
        k, n = int(above[j]), int(above[j] + below[j])
        n_eff = effective_size(n, rho)
        p = sign_test(n_eff, k * n_eff / n) if n else 1.0
        lo, hi = median_interval(values.tolist(), CONFIDENCE)
        out.append(RankEvidence(r, k, n, min(1.0, p * len(ranks)), float(np.median(values)), (float(lo), float(hi)),
                                max(rho, 0.0)))
    out.sort(key=lambda e: (e.p_value, -e.excess_ms, e.rank))
    return out


def _excess(window: Sequence[IterationAnalysis], ranks: list[int]) -> F64:
    """(iterations × ranks) of each rank's busy excess over the others' median; NaN where a rank is missing."""
    column = {r: i for i, r in enumerate(ranks)}
    excess = np.full((len(window), len(ranks)), np.nan)
    for i, a in enumerate(window):
        for row in a.per_rank:
            if row.rank in column:
                excess[i, column[row.rank]] = row.deviation_ms
    return excess


def _serial(history: Sequence[IterationAnalysis], ranks: list[int]) -> float:
    """Lag-1 autocorrelation of the signs of the ranks' excess over ``history`` (what the sign test counts), each
    rank's about its own mean, pooled. Of the signs, not the excess itself: a rank above the others in every
    iteration has no sign to correlate; its excess may drift (a hog's share of a core does), but its count of
    iterations above is not in doubt, while a balanced job's drift shows as runs of one sign."""
    excess = _excess(history, ranks)
    num = den = 0.0
    for column in excess.T:
        signs = np.sign(column[~np.isnan(column)])
        if len(signs) < 2:
            continue
        e = signs - signs.mean()
        num += float((e[:-1] * e[1:]).sum())
        den += float((e * e).sum())
    return num / den if den > 0 else 0.0


def decide(window: Sequence[IterationAnalysis], previous: SteadyStraggler | None = None,
           history: Sequence[IterationAnalysis] = ()) -> SteadyStraggler | None:
    """The straggler over ``window`` (oldest first, counted iterations only), given the one named before it; None
    when no rank passes the rule (see the module's docstring). ``history``: as for :func:`evidence`."""
    if not window:
        return None
    floor = min_effect(window)
    found = evidence(window, history)
    named = next((e for e in found if e.p_value <= NAME_ALPHA and e.excess_range_ms[0] >= floor), None)
    if named is None and previous is not None:
        named = next((e for e in found if e.rank == previous.rank and e.p_value <= KEEP_ALPHA
                      and e.excess_ms >= floor), None)
    if named is None:
        return None
    category, category_ms = _category(window, named.rank)
    return SteadyStraggler(named.rank, category, named.above, named.excess_ms, named.excess_range_ms,
                           category_ms, named.iterations, named.p_value)


def _category(window: Sequence[IterationAnalysis], rank: int) -> tuple[str, float]:
    """The work category where ``rank``'s excess has the largest median over the window, and that median (ms)."""
    per: dict[str, list[float]] = {c: [] for c in WORK}
    for a in window:
        mine = next((row for row in a.per_rank if row.rank == rank), None)
        others = [row for row in a.per_rank if row.rank != rank]
        if mine is None or not others:
            continue
        for c in WORK:
            field = f"{c}_ms"
            per[c].append(getattr(mine, field) - float(np.median([getattr(o, field) for o in others])))
    medians = {c: float(np.median(v)) if v else 0.0 for c, v in per.items()}
    best = max(WORK, key=lambda c: (medians[c], -WORK.index(c)))
    return best, medians[best]
