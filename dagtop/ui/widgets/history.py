"""The history panel: iteration time over the last iterations, stacked by critical-path category."""

from __future__ import annotations

from rich.console import RenderableType

from dagtop.ui.renderables.history import HistoryChart
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class History(Panel):
    """Newest on the right; the iteration shown is marked ▲."""

    def drawn_from(self, view: View) -> tuple[object, ...]:
        bars = view.snapshot.iterations  # a new iteration adds a bar, and in a full window drops the first
        return (*super().drawn_from(view), len(bars), id(bars[0]) if bars else None, id(bars[-1]) if bars else None)

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        return HistoryChart(view.snapshot.iterations, self.content_size.height, a.iteration)
