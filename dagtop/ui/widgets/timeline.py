"""The timeline panel: the Gantt chart of the iteration shown, every rank's lanes and the critical path."""

from __future__ import annotations

from rich.console import RenderableType

from dagtop.ui.renderables.timeline import TimelineChart
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class Timeline(Panel):
    """Draws :class:`TimelineChart` at the panel's height; the title names the iteration and its time."""

    def watch_view(self, view: View) -> None:
        a = view.analysis
        if a is None:
            self.border_title = "timeline"
        else:
            self.border_title = (f"timeline · iteration {a.iteration} · {a.measured_ms:.1f} ms"
                                 f" (model {a.predicted_ms:.1f} ms)")

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        return TimelineChart(a, self.content_size.height, view.focus_rank)
