"""The Gantt chart of one iteration: a row per rank and lane, the collectives across ranks and the critical path.

Glyphs carry the meaning as well as colours (so a screen capture over SSH still reads):
``█`` a task on the critical path, ``▒`` a task off it, ``·`` a rank waiting for the others at a collective,
``━`` a collective running on every rank. The last row follows the critical path through time and names
the rank it runs on, so a jump to a straggler shows as a change of rank.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment as RichSegment
from rich.style import Style
from rich.text import Text

from dagtop.model.lateness import lateness_ms
from dagtop.model.snapshot import IterationAnalysis
from dagtop.model.tasks import Task
from dagtop.ui.palette import FOCUS_STYLE, STRAGGLER_COLOUR, colour
from dagtop.ui.renderables.cells import Cell, cells_to_text
from instrument.events import CATEGORIES

LABEL_WIDTH = 10
"""Cells for the row labels (``r12 comm``) on the left."""
CRITICAL, OFF_PATH, WAIT, COLLECTIVE = "█", "▒", "·", "━"
_LANE_ORDER = {"main": 0, "comm": 1}


@dataclass(frozen=True, slots=True)
class Row:
    """One drawn row: its label, its label's style and its plot cells."""

    label: str
    label_style: Style | str
    cells: Text


def _lane_key(lane: str) -> tuple[int, str]:
    return (_LANE_ORDER.get(lane, 2), lane)


class _Grid:
    """Maps the iteration's time span onto ``width`` cells and paints the winner of each cell."""

    def __init__(self, origin_ns: int, end_ns: int, width: int) -> None:
        self.origin = origin_ns
        self.width = max(width, 1)
        self.scale = self.width / max(end_ns - origin_ns, 1)
        self.lo = [origin_ns + c / self.scale for c in range(self.width)]
        self.hi = [origin_ns + (c + 1) / self.scale for c in range(self.width)]
        """Each cell's time span [lo, hi) in ns, computed once per grid: a redraw weighs 10^5 cells against them."""

    def span(self, start_ns: int, end_ns: int) -> range:
        c0 = int((start_ns - self.origin) * self.scale)
        c1 = int((end_ns - self.origin) * self.scale + 0.999)
        c0 = min(max(c0, 0), self.width - 1)
        return range(c0, min(max(c1, c0 + 1), self.width))


_PRIORITY = {OFF_PATH: 0, WAIT: 1, COLLECTIVE: 1, CRITICAL: 2}
"""Where spans share a cell, the more telling glyph wins (the critical path over the rest), then the longer span."""


def _paint_cells(grid: _Grid, spans: Iterable[tuple[int, int, str, Style]]) -> list[Cell]:
    """Each cell shows one span touching it: ``(start, end, glyph, style)``."""
    best: list[tuple[tuple[int, float], str, Style] | None] = [None] * grid.width
    lo, hi = grid.lo, grid.hi
    for start, end, glyph, style in spans:
        priority = _PRIORITY.get(glyph, 0)
        for c in grid.span(start, end):
            cur = best[c]
            if cur is not None and cur[0][0] > priority:
                continue
            # The span's overlap with the cell, in ns (at least 1e-9, so a touch counts): written without min() and
            # max(), whose calls cost a third more per redraw in this inner loop (benchmarks/bench_timeline.py).
            h, lo_c = hi[c], lo[c]
            overlap = (h if h <= end else end) - (lo_c if lo_c >= start else start)  # noqa: FURB136
            key = (priority, overlap if overlap > 0 else 1e-9)
            if cur is None or key > cur[0]:
                best[c] = (key, glyph, style)
    return [(" ", "") if b is None else (b[1], b[2]) for b in best]


def _paint(grid: _Grid, spans: Iterable[tuple[int, int, str, Style]]) -> Text:
    return cells_to_text(_paint_cells(grid, spans))


def _axis(grid: _Grid, total_ms: float) -> Text:
    """Tick labels in ms every ~12 cells, then the unit: a label that would run into the unit is left out whole
    (cut short, ``┊500`` would read ``┊50``)."""
    unit = " ms" if grid.width > len(" ms") else ""
    room = grid.width - len(unit)
    cells = [" "] * room
    step_ms = _nice_step(total_ms * 12 / max(grid.width, 1))
    t = 0.0
    while True:
        c = int(t / total_ms * grid.width) if total_ms > 0 else 0
        tick = f"┊{round(t, 6):g}" if t else "0"  # rounded: 0.1 + 0.2 would print 0.30000000000000004
        if c + len(tick) > room:
            break
        cells[c:c + len(tick)] = list(tick)
        t += step_ms
    return Text("".join(cells) + unit, style="dim")


def _nice_step(raw: float) -> float:
    """The smallest round tick step (1, 2, 2.5 or 5 times a power of ten, in ms) of at least ``raw``."""
    for exponent in range(-2, 7):
        for mantissa in (1, 2, 2.5, 5):
            if mantissa * 10.0**exponent >= raw:
                return mantissa * 10.0**exponent
    return raw


_chosen: list[tuple[IterationAnalysis, int, int | None, tuple[list[int], bool, int]]] = []
"""The last choice of ranks, held with its analysis: redraws of one iteration (every frame while it is the newest)
sort its ranks once."""


def _choose_ranks(analysis: IterationAnalysis, budget: int, focus_rank: int | None) -> tuple[list[int], bool, int]:
    """The ranks to draw in ``budget`` rows, whether each lane gets a row of its own, and how many ranks there are."""
    for held, held_budget, held_focus, choice in _chosen:
        if held is analysis and held_budget == budget and held_focus == focus_rank:
            return choice
    lanes = analysis.tasks.lanes
    straggler = _named(analysis)
    gating = analysis.straggler.rank if analysis.straggler else None
    on_path = {s.rank for s in analysis.critical_path if s.rank is not None}
    ranks = sorted(lanes)
    split = sum(len(v) for v in lanes.values()) <= budget
    shown = ranks
    if not split and len(ranks) > budget:
        late = lateness_ms(analysis)  # once per analysis, memoised by the model
        priority = sorted(ranks, key=lambda r: (r != focus_rank, r != straggler, r != gating, r not in on_path,
                                                -late.get(r, 0.0), r))
        shown = priority[: max(budget - 1, 1)]
    shown = sorted(shown, key=lambda r: (r != focus_rank, r))  # the focused rank's rows first, the rest by rank
    choice = (shown, split, len(ranks))
    _chosen[:] = [*_chosen[-1:], (analysis, budget, focus_rank, choice)]  # the last two: live and browsed
    return choice


def _named(analysis: IterationAnalysis) -> int | None:
    """The straggler the steady verdict names as of ``analysis`` (the headline's, the ranks table's)."""
    named = analysis.steady.straggler if analysis.steady is not None else None
    return named.rank if named is not None else None


def timeline_rows(analysis: IterationAnalysis, width: int, height: int, focus_rank: int | None = None) -> list[Row]:
    """The rows of the chart, at most ``height`` of them, each ``width - LABEL_WIDTH`` plot cells wide.

    The focused rank's rows come first, the others follow by rank number. Ranks beyond the rows available are
    left out in this order of importance: the focused rank, the straggler (the verdict's), the rank the path waited
    for at a collective in this iteration, the ranks the critical path runs on,
    the ranks latest at the collectives (nearest the path), then the lowest rank numbers. When every lane of every
    rank cannot fit, each rank gets one row (its lanes overlaid). Only the rows drawn are painted: the work grows
    with the rows shown, not with the ranks.
    """
    plot_w = max(width - LABEL_WIDTH, 1)
    tasks = analysis.tasks  # grouped by rank once, by the model: a redraw only reads the groups
    ends = [s.end_ns for s in analysis.critical_path] + [c.end_ns for c in analysis.collectives]
    if tasks.end_ns is not None:
        ends.append(tasks.end_ns)
    end_ns = max(ends, default=analysis.origin_ns + 1)
    grid = _Grid(analysis.origin_ns, end_ns, plot_w)
    total_ms = (end_ns - analysis.origin_ns) / 1e6

    lanes = tasks.lanes
    straggler = _named(analysis)
    fixed = 3  # axis, collectives, critical path
    budget = max(height - fixed, 1)
    shown, split, n_ranks = _choose_ranks(analysis, budget, focus_rank)

    segments: dict[int | None, list[tuple[int, int, str]]] = {}
    for s in analysis.critical_path:
        segments.setdefault(s.rank, []).append((s.start_ns, s.end_ns, s.category))
    critical_by_rank = {rank: _Segments(found) for rank, found in segments.items()}
    waits: dict[int, list[tuple[int, int]]] = {}
    for c in analysis.collectives:
        for r in shown:  # not every rank's: a 1024-rank iteration draws a handful
            ready = c.ready_ns.get(r)
            if ready is not None and ready < c.start_ns:
                waits.setdefault(r, []).append((ready, c.start_ns))

    rows = [Row("", "", _axis(grid, total_ms))]
    for r in shown:
        lane_groups = [[lane] for lane in sorted(lanes[r], key=_lane_key)] if split else [sorted(lanes[r], key=_lane_key)]
        for group in lane_groups:
            spans = list(_rank_spans(tasks.by_rank[r], r, group, critical_by_rank, waits))
            name = f"r{r} {group[0]}" if split else f"r{r}"
            style: Style | str = FOCUS_STYLE if r == focus_rank else (STRAGGLER_COLOUR if r == straggler else "")
            rows.append(Row(name, style, _paint(grid, spans)))
    if len(shown) < n_ranks:
        rows.append(Row("", "", Text(f"… {n_ranks - len(shown)} more ranks (r: focus one)", style="dim")))
    rows.append(Row("⇄ all", "", _paint(grid, _collective_spans(analysis))))
    rows.append(Row("critical", "bold", _critical_row(grid, analysis)))
    return rows[:height] if height > 0 else rows


_OFF_PATH_STYLE: Final = {c: Style(color=colour(c), dim=True) for c in CATEGORIES}
_CRITICAL_STYLE: Final = {c: Style(color=colour(c), bold=True) for c in CATEGORIES}
"""A task's style by category, made once (a redraw paints tens of thousands of tasks)."""


class _Segments:
    """One rank's stretches of the critical path, ``(start, end, category)``, found by bisection: a per-layer
    iteration has hundreds of tasks and of segments a rank, and a scan of one for each of the other is what made a
    redraw slow (benchmarks/bench_monitor.py)."""

    __slots__ = ("reach", "segments", "starts")

    def __init__(self, segments: Iterable[tuple[int, int, str]]) -> None:
        self.segments = sorted(segments)
        self.starts = [s for s, _, _ in self.segments]
        self.reach: list[int] = []
        """The latest end among the segments up to each one (segments may overlap: no order of ends is assumed)."""
        top = -1 << 62
        for _, end, _ in self.segments:
            top = max(top, end)
            self.reach.append(top)

    def overlapping(self, start_ns: int, end_ns: int, category: str) -> list[tuple[int, int]]:
        """The parts of ``[start_ns, end_ns)`` that segments of ``category`` overlap, one per segment."""
        first = bisect_right(self.reach, start_ns)  # every segment before it ends by start_ns
        stop = bisect_left(self.starts, end_ns)  # every segment from it on starts at end_ns or later
        return [(max(s, start_ns), min(e, end_ns)) for s, e, c in self.segments[first:stop]
                if c == category and e > start_ns]


_NO_SEGMENTS: Final = _Segments(())


def _rank_spans(
    tasks: Sequence[Task],
    rank: int,
    lanes: Sequence[str],
    critical_by_rank: dict[int | None, _Segments],
    waits: dict[int, list[tuple[int, int]]],
) -> Iterable[tuple[int, int, str, Style]]:
    critical = critical_by_rank.get(rank, _NO_SEGMENTS)
    collectives = critical_by_rank.get(None, _NO_SEGMENTS)  # a collective on the path runs on every rank
    for t in tasks:
        if t.lane not in lanes:
            continue
        # A task is on the path where a segment of the same rank and category overlaps it.
        mine = collectives if t.category == "allreduce" else critical
        on = mine.overlapping(t.start_ns, t.end_ns, t.category)
        yield t.start_ns, t.end_ns, OFF_PATH, _OFF_PATH_STYLE[t.category]
        for s, e in on:
            yield s, e, CRITICAL, _CRITICAL_STYLE[t.category]
        if t.category == "allreduce":
            for s, e in waits.get(rank, []):
                lo, hi = max(s, t.start_ns), min(e, t.end_ns)
                if hi > lo:
                    yield lo, hi, WAIT, _OFF_PATH_STYLE["allreduce"]


def _collective_spans(analysis: IterationAnalysis) -> Iterable[tuple[int, int, str, Style]]:
    path = {(s.name, s.start_ns) for s in analysis.critical_path if s.rank is None}
    for c in analysis.collectives:
        on = any(name == c.name for name, _ in path)
        yield c.start_ns, c.end_ns, COLLECTIVE, Style(color=colour("allreduce"), bold=on, dim=not on)


def _critical_row(grid: _Grid, analysis: IterationAnalysis) -> Text:
    spans = [(s.start_ns, s.end_ns, CRITICAL, Style(color=colour(s.category))) for s in analysis.critical_path]
    cells = _paint_cells(grid, spans)
    # Name the rank at the start of each stretch the path spends on one rank; "all" for collectives, or the first
    # one's name where it fits and says more than a DDP bucket's number (FSDP's: "all-gather layers.3").
    stretches: list[tuple[int | None, int, int, str, str]] = []
    for s in analysis.critical_path:
        if stretches and stretches[-1][0] == s.rank:
            r, start, _, category, first = stretches[-1]
            stretches[-1] = (r, start, s.end_ns, category, first)
        else:
            stretches.append((s.rank, s.start_ns, s.end_ns, s.category, s.name))
    for rank, start, end, category, first in stretches:
        name = "all" if rank is None else f"r{rank}"
        if rank is None and not first.startswith("bucket ") and (end - start) * grid.scale >= len(first):
            name = first
        c = grid.span(start, end).start
        if c + len(name) <= grid.width and (end - start) * grid.scale >= len(name):
            painted = cells[c][1]
            bg = painted.color if isinstance(painted, Style) and painted.color else colour(category)
            label_style = Style(color="black", bgcolor=bg, bold=True)
            cells[c:c + len(name)] = [(ch, label_style) for ch in name]
    return cells_to_text(cells)


class TimelineChart:
    """A Rich renderable of :func:`timeline_rows`, as tall as ``height`` and as wide as the console allows."""

    def __init__(self, analysis: IterationAnalysis, height: int, focus_rank: int | None = None) -> None:
        self.analysis = analysis
        self.height = height
        self.focus_rank = focus_rank

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        rows = timeline_rows(self.analysis, width, self.height, self.focus_rank)
        for row in rows:
            line = Text()
            line.append(row.label[: LABEL_WIDTH - 1].ljust(LABEL_WIDTH - 1), style=row.label_style)
            line.append(" ")
            line.append_text(row.cells)
            yield from line.render(console)
            yield RichSegment.line()
