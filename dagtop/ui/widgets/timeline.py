"""The timeline panel: the Gantt chart of the iteration shown, every rank's lanes and the critical path.

Above :data:`MANY_RANKS` ranks a row per rank is no longer readable: the chart keeps the critical path, the focused
rank, the straggler and the ranks on or nearest the path, and a lateness heatmap (rank × recent iteration) sits
beside it, so who is late, and whether always the same rank, shows at a glance.
"""

from __future__ import annotations

from typing import Final

from rich.console import RenderableType
from rich.table import Table

from dagtop.ui.renderables.heatmap import LABEL_WIDTH, LEGEND, HeatmapChart
from dagtop.ui.renderables.timeline import TimelineChart
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel

MANY_RANKS: Final = 16
"""Above this many ranks the heatmap is drawn beside the chart."""
_HEATMAP_MIN, _HEATMAP_SHARE = 30, 0.4
"""The heatmap's width: its iterations and labels, at most 40% of the panel, at least 30 cells."""


def many_ranks(view: View) -> bool:
    return view.analysis is not None and len(view.analysis.ranks) > MANY_RANKS


class Timeline(Panel):
    """Draws :class:`TimelineChart` at the panel's height; the title names the iteration and its time."""

    def drawn_from(self, view: View) -> tuple[object, ...]:
        if not many_ranks(view):
            return super().drawn_from(view)
        bars = view.snapshot.iterations  # the heatmap's window moves with each new iteration
        return (*super().drawn_from(view), len(bars), id(bars[0]) if bars else None, id(bars[-1]) if bars else None)

    def watch_view(self, view: View) -> None:
        a = view.analysis
        if a is None:
            self.border_title = "timeline"
            self.border_subtitle = ""
        else:
            self.border_title = (f"timeline · iteration {a.iteration} · {a.measured_ms:.1f} ms"
                                 f" (model {a.predicted_ms:.1f} ms)")
            self.border_subtitle = f"lateness at collectives: {LEGEND}" if many_ranks(view) else ""

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        height = self.content_size.height
        chart = TimelineChart(a, height, view.focus_rank)
        if not many_ranks(view):
            return chart
        iterations = view.snapshot.iterations or (a,)
        width = self.content_size.width
        heat_w = min(max(len(iterations) + LABEL_WIDTH, _HEATMAP_MIN), int(width * _HEATMAP_SHARE))
        selected = a.iteration if view.paused else None
        grid = Table.grid(expand=True, padding=(0, 0, 0, 1))
        grid.add_column(ratio=1, no_wrap=True)
        grid.add_column(width=heat_w, no_wrap=True)
        grid.add_row(chart, HeatmapChart(iterations, height, view.focus_rank, selected))
        return grid
