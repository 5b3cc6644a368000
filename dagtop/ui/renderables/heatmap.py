"""The lateness heatmap: a row per rank, a column per recent iteration, each cell how late that rank was.

Ranks are ordered the latest over the window first, so the one to look at is on top; the last line says what the
pattern is (always the same rank, a rotating one, a one-off stall). Glyphs carry the meaning as well as colours:
``·`` on time, then ``░ ▒ ▓ █`` as the rank is later, in shares of the iteration's time.

A redraw builds only the rows it draws: the ordering and the lateness are the model's, computed once a window
(:mod:`dagtop.model.lateness`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment as RichSegment
from rich.style import Style
from rich.text import Text

from dagtop.model.lateness import LATE_SHARE, Window, lateness_window
from dagtop.model.snapshot import IterationAnalysis
from dagtop.ui.palette import FOCUS_STYLE, STRAGGLER_COLOUR
from dagtop.ui.renderables.cells import Cell, cells_to_text

LABEL_WIDTH: Final = 6
"""Cells for the rank labels (``r1023``) and a space."""
_LEVELS: Final[tuple[tuple[float, str, Style], ...]] = (
    (LATE_SHARE / 2, "·", Style(dim=True)),
    (LATE_SHARE, "░", Style(color=STRAGGLER_COLOUR, dim=True)),
    (0.15, "▒", Style(color=STRAGGLER_COLOUR)),
    (0.30, "▓", Style(color=STRAGGLER_COLOUR)),
    (float("inf"), "█", Style(color=STRAGGLER_COLOUR, bold=True)),
)
"""Up to each share of the iteration's time a rank is behind the median: its glyph and style."""
LEGEND: Final = "· on time ░▒▓█ late"


def _cell(late_ms: float, iteration_ms: float) -> Cell:
    share = late_ms / max(iteration_ms, 1e-9)
    for bound, glyph, style in _LEVELS:
        if share < bound:
            return glyph, style
    return _LEVELS[-1][1], _LEVELS[-1][2]  # unreachable: the last bound is infinite


def heatmap_rows(window: Window, width: int, height: int, focus_rank: int | None = None,
                 selected: int | None = None) -> list[Text]:
    """At most ``height`` lines of at most ``width`` cells: a header, a row per rank that fits, the pattern.

    The focused rank comes first, then the latest ranks; the newest iteration is on the right, and ``selected`` (the
    iteration shown, while browsing) is marked in the header.
    """
    columns = max(min(len(window.iterations), width - LABEL_WIDTH), 0)
    shown_iterations = window.iterations[len(window.iterations) - columns:]
    late = window.late[len(window.late) - columns:]
    room = max(height - 2, 0)
    order: Sequence[int] = window.order
    if focus_rank is not None and window.iterations and focus_rank in window.iterations[-1].ranks:
        head = [focus_rank, *(r for r in order[:room] if r != focus_rank)]
        order = head
    ranks = order[:room]

    header = Text(" " * LABEL_WIDTH, style="dim")
    marks = ["▼" if a.iteration == selected else " " for a in shown_iterations]
    if shown_iterations:
        first = f"it {shown_iterations[0].iteration}"
        marks[: len(first)] = list(first[:columns])
    header.append("".join(marks)[:columns], style="dim")
    lines = [header]
    for r in ranks:
        cells = [_cell(by_rank.get(r, 0.0), a.measured_ms) for a, by_rank in zip(shown_iterations, late, strict=True)]
        label = Text(f"r{r}"[: LABEL_WIDTH - 1].ljust(LABEL_WIDTH), style=FOCUS_STYLE if r == focus_rank else "")
        lines.append(label + cells_to_text(cells))
    hidden = len(window.order) - len(ranks)
    summary = window.pattern.describe()
    more = f" · {hidden} more ranks"
    if hidden > 0 and len(summary) + len(more) <= width:  # said only whole: cut short it would read wrong
        summary += more
    lines.append(Text(summary[:width], style="bold" if window.pattern.kind != "none" else "dim"))
    return lines[:height] if height > 0 else []


class HeatmapChart:
    """A Rich renderable of :func:`heatmap_rows` over ``iterations``, as tall as ``height``."""

    def __init__(self, iterations: Sequence[IterationAnalysis], height: int, focus_rank: int | None = None,
                 selected: int | None = None) -> None:
        self.window = lateness_window(iterations)
        self.height = height
        self.focus_rank = focus_rank
        self.selected = selected

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in heatmap_rows(self.window, options.max_width, self.height, self.focus_rank, self.selected):
            line.truncate(options.max_width)
            yield from line.render(console)
            yield RichSegment.line()
