"""Iteration time over the last iterations, each bar stacked by the categories of its critical path."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment as RichSegment
from rich.style import Style
from rich.text import Text

from dagtop.model.snapshot import IterationAnalysis
from dagtop.ui.palette import STACK_ORDER, colour
from dagtop.ui.renderables.cells import Cell, cells_to_text

_EIGHTHS = " ▁▂▃▄▅▆▇█"
AXIS_WIDTH = 7
"""Cells for the ms labels on the left."""


def stack_ms(analysis: IterationAnalysis) -> list[tuple[str, float]]:
    """The iteration's measured time split by its critical path's shares, bottom of the stack first."""
    return [(c, analysis.shares.get(c, 0.0) * analysis.measured_ms) for c in STACK_ORDER]


def _column(stack: Sequence[tuple[str, float]], scale: float, rows: int) -> list[tuple[str, str]]:
    """Cells of one bar from the bottom up: each full cell takes the category at its middle."""
    bounds: list[tuple[float, str]] = []
    top = 0.0
    for category, ms in stack:
        top += ms * scale
        bounds.append((top, category))
    cells: list[tuple[str, str]] = []
    top = min(top, float(rows))
    for k in range(rows):
        if top >= k + 1:
            mid = k + 0.5
            category = next((c for b, c in bounds if b >= mid), bounds[-1][1])
            cells.append(("█", category))
        elif top > k:
            eighths = round((top - k) * 8)
            mid = (k + top) / 2  # the category that fills most of the partial cell
            category = next((c for b, c in bounds if b >= mid), bounds[-1][1])
            cells.append((_EIGHTHS[eighths], category) if eighths else (" ", ""))
        else:
            cells.append((" ", ""))
    return cells


def bar_widths(bars: int, plot_w: int) -> list[int]:
    """Widths of ``bars`` bars that fill ``plot_w`` cells exactly, each at least one cell, none two cells wider
    than another (at most ``plot_w`` bars: pass no more)."""
    if bars <= 0:
        return []
    return [(i + 1) * plot_w // bars - i * plot_w // bars for i in range(bars)]


def history_lines(analyses: Sequence[IterationAnalysis], width: int, height: int,
                  selected: int | None = None) -> list[Text]:
    """The chart as ``height`` lines: bars across the whole width (newest right), ms scale left, iteration
    numbers below.

    Args:
        analyses: oldest first; the newest that fit (one cell each at least) are drawn, widened to fill the plot.
        selected: the iteration number marked with ``▲`` under its bar (the one the other panels show).
    """
    rows = max(height - 1, 1)
    plot_w = max(width - AXIS_WIDTH, 1)
    shown = list(analyses)[-plot_w:]
    widths = bar_widths(len(shown), plot_w)
    # Warm-up iterations do not set the scale (a taller bar is clipped): they would flatten every other bar.
    steady = [a.measured_ms for a in shown if not a.in_warm_up] or [a.measured_ms for a in shown]
    peak = max(steady, default=0.0)
    scale = rows / peak if peak > 0 else 0.0
    columns = [_column(stack_ms(a), scale, rows) if a.measured_ms > 0 else [(" ", "")] * rows for a in shown]
    styles = _Styles()
    lines = []
    for k in reversed(range(rows)):
        if k == rows - 1:
            axis = f"{peak:.0f} ms"
        elif k == 0:
            axis = "0"
        else:
            axis = ""
        line = Text(axis.rjust(AXIS_WIDTH - 1)[: AXIS_WIDTH - 1] + "│", style="dim")
        line.append(" " * (plot_w - sum(widths)))
        cells: list[Cell] = []
        for a, col, bar_w in zip(shown, columns, widths):
            glyph, category = col[k]
            style = styles[(category, a.iteration == selected, selected is not None)]
            cells.extend([(glyph, style)] * bar_w)
        line.append_text(cells_to_text(cells))
        lines.append(line)
    lines.append(_iteration_axis(shown, plot_w, widths, selected))
    return lines[:height]


def _iteration_axis(shown: Sequence[IterationAnalysis], plot_w: int, widths: Sequence[int],
                    selected: int | None) -> Text:
    cells = [" "] * plot_w
    offset = plot_w - sum(widths)
    if shown:
        first, last = f"it {shown[0].iteration}", f"{shown[-1].iteration}"
        cells[offset:offset + len(first)] = list(first)
        cells[plot_w - len(last):] = list(last)
    start = offset
    for a, bar_w in zip(shown, widths):
        if a.iteration == selected and a is not shown[-1]:
            mark = f"▲{a.iteration}"
            at = min(start, plot_w - len(mark))
            cells[at:at + len(mark)] = list(mark)
        start += bar_w
    return Text(" " * AXIS_WIDTH + "".join(cells)[:plot_w], style="dim")


class _Styles(dict[tuple[str, bool, bool], Style]):
    """Bar styles by (category, is the selected iteration, is any selected), built once per chart."""

    def __missing__(self, key: tuple[str, bool, bool]) -> Style:
        category, chosen, any_selected = key
        style = Style(color=colour(category)) if category else Style()
        if chosen:
            style += Style(bold=True)
        elif any_selected:
            style += Style(dim=True)
        self[key] = style
        return style


class HistoryChart:
    """A Rich renderable of :func:`history_lines`, as tall as ``height``."""

    def __init__(self, analyses: Sequence[IterationAnalysis], height: int, selected: int | None = None) -> None:
        self.analyses = analyses
        self.height = height
        self.selected = selected

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in history_lines(self.analyses, options.max_width, self.height, self.selected):
            yield from line.render(console)
            yield RichSegment.line()
