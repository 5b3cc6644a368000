"""A called module's own work: the part of its forward or backward that no timed module inside it ran.

The timed units (blocks, or layers) are the modules whose time is shown; the modules around them (the model,
a wrapper opened up to its layers, a transformer block whose attention math runs between its linear layers)
also run code of their own: a loss inside ``forward``, position ids, a softmax, a residual sum. Untimed, that
work would be left between the units and show as "other". So those modules are timed too, as *spans* on a
lane of their own (``span:<lane>``), and before an iteration is sent, off the training thread,
:func:`fill_spans` replaces each span by the stretches of it that no other task on its lane covers: tasks of the
module's name, on the real lane. Tasks on a lane never overlap, spans nested in spans included: inner (shorter)
spans are filled first, then count as covered for the spans around them.

Pure Python: the publisher thread runs it, and it must not import torch.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from instrument.events import RawEvent

SPAN: Final = "span:"
"""Prefix of a span's lane: ``span:main`` is a span of a module on the ``main`` lane."""
MIN_GAP_NS: Final = 20_000
"""Stretches shorter than this are left out (they stay untimed, "other", as before spans): between two timed
modules called one after the other, the hooks' own dispatch leaves a stretch of 5-19 µs on the CPU lane (2-core
VM, a Sequential of Linear layers), which is dagtop's cost, not the module's work."""


def fill_spans(events: Sequence[RawEvent]) -> list[RawEvent]:
    """The events with each span replaced by its uncovered stretches (see the module docstring).

    Events are ``(category, phase, name, lane, start_ns, end_ns, bytes)``.

    >>> fill_spans([("compute", "forward", "m", "span:main", 0, 900_000, 0),
    ...             ("compute", "forward", "m.fc", "main", 200_000, 890_000, 0)])  # doctest: +NORMALIZE_WHITESPACE
    [('compute', 'forward', 'm.fc', 'main', 200000, 890000, 0), ('compute', 'forward', 'm', 'main', 0, 200000, 0)]
    """
    spans = [e for e in events if e[3].startswith(SPAN)]
    if not spans:
        return list(events)
    out = [e for e in events if not e[3].startswith(SPAN)]
    covered: dict[str, list[tuple[int, int]]] = {}
    for e in out:
        covered.setdefault(e[3], []).append((e[4], e[5]))
    for intervals in covered.values():
        intervals.sort()
    for category, phase, name, span_lane, start, end, _ in sorted(spans, key=lambda e: e[5] - e[4]):
        lane = span_lane[len(SPAN):]
        intervals = covered.setdefault(lane, [])
        gaps = _uncovered(intervals, start, end)
        for a, b in gaps:
            out.append((category, phase, name, lane, a, b, 0))
            intervals.insert(bisect_left(intervals, (a, b)), (a, b))
    return out


def _uncovered(intervals: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The stretches of [start, end) that no interval covers and that are at least MIN_GAP_NS long.

    ``intervals`` is sorted by start; they may overlap each other (tasks of other threads on a CPU lane).
    """
    gaps: list[tuple[int, int]] = []
    at = start
    for a, b in intervals[: bisect_left(intervals, (end, end))]:
        if b <= at:
            continue
        if a - at >= MIN_GAP_NS:
            gaps.append((at, a))
        at = max(at, b)
    if end - at >= MIN_GAP_NS:
        gaps.append((at, end))
    return gaps
