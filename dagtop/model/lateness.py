"""Who is late, iteration after iteration: each rank's lateness at the collectives, and what pattern it makes.

A rank's lateness in an iteration is how long after the median rank it became ready for a collective, at worst
over the iteration's collectives (ms, 0 when never behind the median): the time the others waited for it. Over a
window of iterations it tells one slow rank (always the same), a rotating one (a different rank each time) or a
one-off stall.

Computed once per analysis and once per window (memoised by object), never per redraw: a redraw of a many-rank
screen reads these and draws only the ranks it has room for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from dagtop.model.snapshot import IterationAnalysis

LATE_SHARE: Final = 0.05
"""A rank counts as late in an iteration where it is behind the median by 5% of the iteration's time or more."""
_MEMO_SIZE: Final = 256
"""Analyses whose lateness is kept: more than the pipeline's window of 120, so browsing back costs nothing."""


def _median(values: list[int]) -> float:
    values.sort()
    n = len(values)
    mid = n // 2
    return float(values[mid]) if n % 2 else (values[mid - 1] + values[mid]) / 2


def _compute_lateness(analysis: IterationAnalysis) -> dict[int, float]:
    late: dict[int, float] = {}
    for c in analysis.collectives:
        if len(c.ready_ns) < 2:
            continue
        median = _median(list(c.ready_ns.values()))
        for r, ready in c.ready_ns.items():
            behind = (ready - median) / 1e6
            if behind > late.get(r, 0.0):
                late[r] = behind
    return late


_memo: dict[tuple[object, ...], dict[int, float]] = {}
"""Lateness by analysis. Keyed by the analysis' id and what tells one analysis from another, never holding the
analysis itself: the memo must not keep iterations alive past the pipeline's window (at 1024 ranks each holds tens
of MB of tasks)."""


def lateness_ms(analysis: IterationAnalysis) -> Mapping[int, float]:
    """Each late rank's lateness in ``analysis`` (ms); a rank never behind the median is absent. Memoised."""
    a = analysis
    key = (id(a), a.iteration, a.origin_ns, a.measured_ms, a.complete, len(a.ranks), len(a.collectives))
    late = _memo.get(key)
    if late is None:
        late = _compute_lateness(a)
        if len(_memo) >= _MEMO_SIZE:
            _memo.pop(next(iter(_memo)))  # the oldest first: dicts keep insertion order
        _memo[key] = late
    return late


def late_rank(analysis: IterationAnalysis) -> int | None:
    """The rank latest in ``analysis`` where it is late by :data:`LATE_SHARE` of the iteration or more."""
    late = lateness_ms(analysis)
    if not late:
        return None
    rank = max(late, key=lambda r: (late[r], -r))
    return rank if late[rank] >= LATE_SHARE * max(analysis.measured_ms, 1e-9) else None


@dataclass(frozen=True, slots=True)
class Pattern:
    """What a window of iterations says of lateness."""

    kind: str
    """``none`` (no rank late), ``same`` (one rank, most iterations), ``rotating`` or ``one-off``."""
    ranks: tuple[int, ...]
    """The late ranks, the most often late first."""
    late_iterations: int
    """Iterations in which some rank was late."""
    iterations: int
    """Iterations in the window."""
    first_iteration: int | None = None
    """For a one-off: the iteration it happened in."""

    def describe(self) -> str:
        """One short line: ``always r7 (late 18/20)``, ``rotating: 3 ranks (late 9/20) r3 r9 r12`` …"""
        n, k = self.iterations, self.late_iterations
        if self.kind == "none":
            return f"no rank late ({n} its)"
        if self.kind == "same":
            return f"{'always' if 2 * k >= n else 'same rank:'} r{self.ranks[0]} (late {k}/{n})"
        if self.kind == "one-off":
            names = " ".join(f"r{r}" for r in self.ranks)
            return f"one-off: {names} at it {self.first_iteration}"
        shown = " ".join(f"r{r}" for r in self.ranks[:4]) + (" …" if len(self.ranks) > 4 else "")
        return f"rotating: {len(self.ranks)} ranks (late {k}/{n}) {shown}"


def lateness_pattern(iterations: Sequence[IterationAnalysis]) -> Pattern:
    """Classify the late rank of each iteration in ``iterations`` (oldest first)."""
    latest = [(a.iteration, late_rank(a)) for a in iterations]
    late = [(it, r) for it, r in latest if r is not None]
    n = len(latest)
    if not late:
        return Pattern("none", (), 0, n)
    counts: dict[int, int] = {}
    for _, r in late:
        counts[r] = counts.get(r, 0) + 1
    ranks = tuple(sorted(counts, key=lambda r: (-counts[r], r)))
    top = counts[ranks[0]]
    if len(late) <= 2 and n >= 5:
        return Pattern("one-off", ranks, len(late), n, late[0][0])
    if top >= 0.75 * len(late):
        return Pattern("same", ranks, top, n)
    return Pattern("rotating", ranks, len(late), n)


@dataclass(frozen=True, slots=True)
class Window:
    """A window's lateness, ready to draw: ranks ordered latest first, and each iteration's lateness by rank."""

    iterations: tuple[IterationAnalysis, ...]
    order: tuple[int, ...]
    """Every rank, the most late over the window first (then by rank number)."""
    late: tuple[Mapping[int, float], ...]
    """Per iteration (as ``iterations``): lateness by rank, ms."""
    pattern: Pattern


_window_memo: list[tuple[tuple[IterationAnalysis, ...], Window]] = []


def lateness_window(iterations: Sequence[IterationAnalysis]) -> Window:
    """The lateness over ``iterations``, memoised on the very analyses (a redraw of the same window is free)."""
    key = tuple(iterations)
    for held, window in _window_memo:
        if len(held) == len(key) and all(a is b for a, b in zip(held, key, strict=True)):
            return window
    late = tuple(lateness_ms(a) for a in key)
    total: dict[int, float] = {}
    ranks: set[int] = set()
    for a, by_rank in zip(key, late, strict=True):
        ranks.update(a.ranks)
        for r, ms in by_rank.items():
            total[r] = total.get(r, 0.0) + ms / max(a.measured_ms, 1e-9)
    order = tuple(sorted(ranks, key=lambda r: (-total.get(r, 0.0), r)))
    window = Window(key, order, late, lateness_pattern(key))
    _window_memo[:] = [*_window_memo[-1:], (key, window)]  # the last two: the live one and the one browsed
    return window
