"""The straggler, named only on evidence: the one rule behind the verdict, the ranks table's ◀, the rank picker and
``dagtop report``.

A rank's **excess** in a work category (io, pcie, compute) in an iteration is its time there minus the median of the
other ranks'. In synchronous SGD every rank's iteration takes the same wall time, the early ones waiting in a
collective, so the difference shows in the work done; each category on its own, so that a loader 40 ms slower
every iteration is not lost in the noise of a compute time shared with other processes. Over a window of
iterations a rank is named, in a category, when:

1. **the sign test says it is not chance**: it was above the others in k of the window's n iterations (ties left
   out), and the one-sided p-value P(Binomial(n, ½) ≥ k), multiplied by the number of tests (ranks × categories
   some rank spends the minimum effect in: Bonferroni, every one had its chance), is at most :data:`NAME_ALPHA`. With
   two ranks one of them is above the other in half of the iterations by chance, and above it in 12 of 20 with
   probability 0.25: a share of "late" iterations is no evidence; 19 of 20 is (p = 2·10⁻⁵). The level is strict
   because the live verdict asks again at every iteration, a few hundred times an hour: at 2·10⁻⁴ a balanced job of
   60 iterations watched live gets a name in under 1 % of runs (tests/test_straggler.py simulates it), and a
   straggler above the others in every iteration is named from its 14th (two ranks; 16th with four).

   Noise on a shared machine is not independent from one iteration to the next: the scheduler favours one rank
   over another for a second or two at a time, and a balanced job of 45-ms steps on this 2-core machine showed runs
   of 20–35 iterations with one rank above, while the lag-1 autocorrelation of its signs was only 0.06–0.26 (the
   dependence is long, not strong). Two things keep such runs from naming anyone:

   - the window **lasts** :data:`SPAN_S` seconds at least (:func:`span`: a job of fast steps is judged over more of
     them, up to :data:`LONGEST`; a job of many ranks over as many as the correction for them leaves the test able
     to name a rank, :func:`reach`), and nothing is named from a shorter one, a recording's either: a rank slower for
     a second is not a straggler yet (in the simulation of tests/test_straggler.py, a job whose first run of one
     rank favoured came at its start was given a straggler in 10 of 30 runs without this);
   - n and k are shrunk to their **effective size**, n divided by how much more a window's count of "above" varies
     than independent signs would (:func:`_inflation`), measured over the last :data:`HISTORY_SPANS` windows' worth
     of iterations: from the counts of every window in them once there are three, or from the lag-1
     autocorrelation ρ of the signs, (1 + ρ) / (1 − ρ), if larger;
   - a rank that **turns** slow after such a stretch of history (:func:`_onset`: from where on it was above in
     :data:`ONSET_SHARE` of the iterations) has the noise measured on the history before that, where it was not
     suspect, and is named once its run has lasted :data:`RUN_S` seconds: a straggler that appears mid-run is named
     within about 5 s (a job of 150-ms steps, simulated: 28 iterations after it began, median), while a run of one
     rank favoured by the scheduler ends before. (Measured over the whole history, the onset itself looked like
     dependence and held the name back until it left the history: 150 iterations and more.)
2. **the effect is large enough to act on, with confidence**: its median excess is at least 10 % of the window's
   median iteration (:data:`NAME_EFFECT` times :func:`min_effect`), and the lower end of its 95 % interval at least
   5 % (and 1 ms): a rank whose excess stays small is not named however regular it is.

A named rank is **kept** while it still passes a weaker test (p ≤ :data:`KEEP_ALPHA` and a median excess of at
least the minimum effect), so that the name does not flicker at the threshold; but keeping it needs evidence too:
a rank above the others in 12 of 20 iterations is dropped.

The excess is reported as the median over **every** iteration of the window with its distribution-free 95 %
interval (order statistics of the binomial), never over a chosen subset: ``+35 ms [28, 41]``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from dagtop.model.analysis import medians_of_the_others
from dagtop.model.snapshot import IterationAnalysis, SteadyStraggler
from dagtop.model.stats import median_interval, sign_test
from dagtop.model.table import F64

NAME_ALPHA: Final = 2e-4
"""The chance, per window, of naming some rank of a job where none is slower (Bonferroni over the ranks)."""
KEEP_ALPHA: Final = 0.05
"""A named rank is kept while its corrected p-value stays at or below this."""
MIN_EFFECT_SHARE: Final = 0.05
"""An excess not known with 95 % confidence to be at least this fraction of the iteration is not worth naming (nor
keeping, its median below it)..."""
MIN_EFFECT_MS: Final = 1.0
"""...nor one below this many ms..."""
NAME_EFFECT: Final = 2.0
"""...and a name needs a median excess of this many times that floor (10 % of the iteration): on a 2-core machine
under load, a balanced job's rank was seen above the other by 5 % of the iteration, consistently, for a minute
(the scheduler's unfairness, not the job's); such a rank, named, would send someone to drain a node for nothing."""
SPAN_S: Final = 2.0
"""A rank is named only from a window of iterations that lasts this many seconds at least (and holds
:data:`~dagtop.model.verdict.WINDOW` iterations at least): on a shared machine the scheduler favours one rank over
another for a second or two at a time (measured here: runs of 20-35 iterations of 45 ms with one rank above), which
in a window of 20 fast iterations looks like a straggler. A job of 100-ms steps or slower is judged over its last 20
iterations; one of 45-ms steps over its last 45."""
RUN_S: Final = 5.0
"""A rank that turns slow after a stretch of history in which it was not is named once it has stayed so this many
seconds: the runs of one rank favoured by the scheduler seen here lasted up to about 2 s."""
REACH: Final = 0.9
"""A window holds enough iterations for a rank above the others in this share of them to be named (:func:`reach`)."""
LONGEST: Final = 150
"""The most iterations a window holds, however short they are."""
HISTORY_SPANS: Final = 8
"""The noise's dependence is measured over up to this many windows' worth of iterations (the window's own and those
before it, or those before a suspect's run)."""
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
    """What a window says of one rank in one category."""

    rank: int
    category: str
    above: int
    """Iterations in which its time in ``category`` was above the other ranks' median."""
    iterations: int
    """Iterations in which it was above or below (ties left out)."""
    p_value: float
    """The sign test's one-sided p-value, multiplied by the number of tests (ranks × categories seen; at most 1)."""
    excess_ms: float
    """Median of its excess over every iteration of the window."""
    excess_range_ms: tuple[float, float]
    """The median's :data:`CONFIDENCE` interval."""
    inflation: float = 1.0
    """How many times the sign test's sample was shrunk for the noise's dependence (:func:`_inflation`, ≥ 1)."""
    run_ms: float = math.inf
    """How long its current run above the others has lasted, where it began after enough history to measure the
    noise on (:func:`_onset`); infinite where it was above from the start of what is known."""


def span(window: Sequence[IterationAnalysis], history: Sequence[IterationAnalysis]) -> Sequence[IterationAnalysis]:
    """The iterations the straggler is judged over: ``window``, or more of ``history`` (which ends with it) until they
    last :data:`SPAN_S` seconds and hold :func:`reach` of them for the job's ranks, at most :data:`LONGEST`."""
    if len(history) <= len(window):
        return window
    held, lasted = len(window), sum(a.measured_ms for a in window)
    longest = min(len(history), max(LONGEST, len(window)))
    wanted = reach(len(window[-1].per_rank))
    while held < longest and (lasted < SPAN_S * 1000.0 or held < wanted):
        held += 1
        lasted += history[-held].measured_ms
    return history[-held:]


@functools.cache
def reach(ranks: int) -> int:
    """The fewest iterations over which a rank above the others in :data:`REACH` of them can be named among
    ``ranks``: the sign test's p-value, times the ranks (the Bonferroni correction's least), at most
    :data:`NAME_ALPHA`. Up to 5 ranks it is within the verdict's 20 iterations (18 with two); it grows with the log
    of the ranks (24 with 8, 27 with 64, 36 with 1024), and a window of 20 would never name a straggler of a
    large job, however slow: 20 of 20 is p = 10⁻⁶, which 1024 ranks' correction makes 10⁻³."""
    n = 1
    while sign_test(n, math.ceil(REACH * n)) * ranks > NAME_ALPHA:
        n += 1
    return n


def lasts(window: Sequence[IterationAnalysis]) -> bool:
    """Whether ``window`` lasts long enough to name a rank from: :data:`SPAN_S` seconds, or :data:`LONGEST`
    iterations."""
    return len(window) >= LONGEST or sum(a.measured_ms for a in window) >= SPAN_S * 1000.0


def evidence(window: Sequence[IterationAnalysis], history: Sequence[IterationAnalysis] = ()) -> list[RankEvidence]:
    """The evidence over ``window`` (oldest first) of every rank and work category that could be named: whose median
    excess reaches :func:`min_effect` (no other could be named, nor kept), the most suspect first (smallest p-value,
    then the largest median excess). A rank missing from an iteration is left out of that iteration.

    Args:
        history: a longer run of counted iterations ending with the window, to estimate the noise's dependence
            from (:func:`_inflation`: the last :data:`HISTORY_SPANS` windows' worth of it); default the window.
    """
    ranks = sorted({row.rank for a in window for row in a.per_rank})
    if len(ranks) < 2 or not window:
        return []
    longer = history[-HISTORY_SPANS * len(window):] if len(history) > len(window) else window
    floor = min_effect(window)
    tests = []
    for category in WORK:
        own = _times(window, ranks, category)
        # A category no rank spends the minimum effect in could not name anyone (an excess is at most the time):
        # no test, and no share of the correction.
        if np.nanmax(np.nanmedian(own, axis=0)) >= floor:
            tests.append((category, _excess(window, ranks, category)))
    out = []
    for category, excess in tests:
        medians = np.nanmedian(excess, axis=0)
        suspects = np.flatnonzero(medians >= floor)
        if not len(suspects):
            continue
        known = _excess(longer, ranks, category)
        above = (excess > 0).sum(axis=0)
        below = (excess < 0).sum(axis=0)
        for j in suspects.tolist():
            onset = _onset(known[:, j], len(window))
            inflation = _inflation(known[:onset], len(window))
            lasted = sum(a.measured_ms for a in longer[onset:]) if onset < len(longer) else math.inf
            column = excess[:, j]
            values = column[~np.isnan(column)].tolist()
            k, n = int(above[j]), int(above[j] + below[j])
            n_eff = n / inflation
            p = sign_test(n_eff, min(k * n_eff / n, n_eff)) if n else 1.0
            lo, hi = median_interval(values, CONFIDENCE)
            out.append(RankEvidence(ranks[j], category, k, n, min(1.0, p * len(ranks) * len(tests)),
                                    float(medians[j]), (float(lo), float(hi)), inflation, lasted))
    out.sort(key=lambda e: (e.p_value, -e.excess_ms, e.rank, e.category))
    return out


def _times(window: Sequence[IterationAnalysis], ranks: list[int], category: str, excess: bool = False) -> F64:
    """(iterations × ranks) of each rank's ms in ``category`` (``busy``: io + pcie + compute), or with ``excess`` its
    ms minus the other ranks' median in that iteration; NaN where a rank is missing. Each analysis's row is made
    once (:func:`_row`)."""
    out = np.full((len(window), len(ranks)), np.nan)
    wanted = tuple(ranks)
    column: dict[int, int] | None = None
    for i, a in enumerate(window):
        held, times, over = _row(a, category)
        values = over if excess else times
        if held == wanted:
            out[i] = values
            continue
        column = column or {r: j for j, r in enumerate(ranks)}
        for r, v in zip(held, values.tolist()):
            if r in column:
                out[i, column[r]] = v
    return out


def _excess(window: Sequence[IterationAnalysis], ranks: list[int], category: str) -> F64:
    """:func:`_times` with ``excess``."""
    return _times(window, ranks, category, excess=True)


_ROWS_KEPT: Final = 4 * (HISTORY_SPANS * LONGEST + 20)
"""Rows kept by :func:`_row`: four categories (io, pcie, compute, busy) of the longest history the verdict reads,
and some..."""
_ROW_VALUES_KEPT: Final = 4_000_000
"""...and at most this many values in all (32 MB): a thousand ranks' rows are many times fewer."""
_rows: dict[tuple[int, str], tuple[object, tuple[int, ...], F64, F64]] = {}
"""Per analysis's rows (by identity, the rows themselves held so that their id is not reused) and category:
(rows, ranks, ms, excess ms)."""


def _row(a: IterationAnalysis, category: str) -> tuple[tuple[int, ...], F64, F64]:
    key = (id(a.per_rank), category)
    held = _rows.get(key)
    if held is None or held[0] is not a.per_rank:
        ranks = tuple(row.rank for row in a.per_rank)
        if category == "busy":
            times = np.array([row.io_ms + row.pcie_ms + row.compute_ms for row in a.per_rank])
        else:
            times = np.array([getattr(row, f"{category}_ms") for row in a.per_rank])
        excess = times - medians_of_the_others(times) if len(times) >= 2 else np.full_like(times, np.nan)
        held = (a.per_rank, ranks, times, excess)
        while _rows and (len(_rows) >= _ROWS_KEPT or len(_rows) * 2 * len(times) >= _ROW_VALUES_KEPT):
            del _rows[next(iter(_rows))]
        _rows[key] = held
    return held[1], held[2], held[3]


def _serial(excess: F64) -> float:
    """Lag-1 autocorrelation of the signs of the ranks' excess (what the sign test counts), each rank's about its own
    mean, pooled. Of the signs, not the excess itself: a rank above the others in every iteration has no sign to
    correlate; its excess may drift (a hog's share of a core does), but its count of iterations above is not in
    doubt, while a balanced job's drift shows as runs of one sign."""
    if len(excess) < 2:
        return 0.0
    num = den = 0.0
    for signs in _signs(excess):
        if len(signs) < 2:
            continue
        e = signs - signs.mean()
        num += float((e[:-1] * e[1:]).sum())
        den += float((e * e).sum())
    return num / den if den > 0 else 0.0


ONSET_SHARE: Final = 0.9
"""A rank's run of iterations above the others begins where, from there to now, it was above in this share of
them at least."""


def _onset(column: F64, n: int) -> int:
    """Where the suspect's current run above the others began in ``column`` (its excess over the history, oldest
    first): the earliest iteration from which it was above in :data:`ONSET_SHARE` of them; the whole history when
    that leaves fewer than three windows of ``n`` before it to measure the noise on."""
    above = np.cumsum((column > 0)[::-1])[::-1]  # iterations above from each one to now
    share = above / np.arange(len(column), 0, -1)
    start = int(np.argmax(share >= ONSET_SHARE)) if (share >= ONSET_SHARE).any() else len(column)
    return start if start >= 3 * n else len(column)


def _signs(excess: F64) -> list[F64]:
    """Each rank's signs of its excess (+1 above, −1 below, 0 a tie), its missing iterations left out."""
    if not np.isnan(excess).any():
        return list(np.sign(excess).T)
    return [np.sign(column[~np.isnan(column)]) for column in excess.T]


def _inflation(excess: F64, n: int) -> float:
    """How many times more the count of "above" in a window of ``n`` iterations varies than it would if the signs
    were independent (at least 1), from ``excess`` (iterations × ranks, oldest first: the window and those before
    it, or those before a suspect's run).

    With three windows' worth of iterations or more: the variance of the sum of the signs over every window of ``n``
    in them, against n times the variance of one sign, pooled over the ranks (the batch-means estimate: it counts
    the dependence at every lag up to n, which a regime of one rank favoured for a second or two is), or
    (1 + ρ) / (1 − ρ) from the lag-1 autocorrelation ρ (:func:`_serial`), whichever is larger: over a few windows the
    batch means underestimate a long dependence, and the first lag alone misses it. With fewer iterations: the
    first lag's figure alone."""
    rho = min(max(_serial(excess), 0.0), 0.95)
    lag1 = (1.0 + rho) / (1.0 - rho)
    if len(excess) < 3 * n:
        return lag1
    num = den = 0.0
    for signs in _signs(excess):
        if len(signs) < 3 * n:
            continue
        num += float(np.convolve(signs, np.ones(n), "valid").var())
        den += n * float(signs.var())
    return max(lag1, num / den) if den > 0 else lag1


def decide(window: Sequence[IterationAnalysis], previous: SteadyStraggler | None = None,
           history: Sequence[IterationAnalysis] = ()) -> SteadyStraggler | None:
    """The straggler over ``window`` (oldest first, counted iterations only) or the longer :func:`span` of
    ``history`` that lasts :data:`SPAN_S`, given the one named before it; None when no rank passes the rule (see the
    module's docstring). ``history``: the counted iterations ending with the window, as for :func:`evidence`."""
    if not window:
        return None
    window = span(window, history)
    young = not lasts(window)  # evidence may keep a name, but not give one
    floor = min_effect(window)
    found = evidence(window, history)
    named = None if young else next((e for e in found if e.p_value <= NAME_ALPHA and e.excess_range_ms[0] >= floor
                                     and e.excess_ms >= NAME_EFFECT * floor and e.run_ms >= RUN_S * 1000.0), None)
    if named is None and previous is not None:
        named = next((e for e in found if e.rank == previous.rank and e.p_value <= KEEP_ALPHA
                      and e.excess_ms >= floor), None)
    if named is None:
        return None
    ranks = sorted({row.rank for a in window for row in a.per_rank})
    busy = _excess(window, ranks, "busy")[:, ranks.index(named.rank)]
    return SteadyStraggler(named.rank, named.category, named.above, named.excess_ms, named.excess_range_ms,
                           float(np.nanmedian(busy)), named.iterations, named.p_value)
