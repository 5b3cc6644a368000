"""The top line: source, ranks, iteration, iterations/s, lag, dropped and rejected events."""

from __future__ import annotations

from rich.console import RenderableType
from textual.reactive import reactive

from dagtop.ui.renderables.status import status_text
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class StatusBar(Panel):
    """One line; lag changes on its own (every half second), the rest with the view."""

    lag_s: reactive[float | None] = reactive(None, layout=False)
    """Seconds from the newest frame's arrival to now; None in replay."""
    job_exited: reactive[bool] = reactive(False, layout=False)
    """The job the screen started (``dagtop demo``) has exited: no rate to show any more."""
    ended_at: reactive[str | None] = reactive(None, layout=False)
    """Wall-clock time (``HH:MM:SS``) the last frame of a job that has ended came; None while it runs."""
    refused: reactive[int] = reactive(0, layout=False)
    """Connections the live source's ``--auth`` refused; read from the app's collector every half second."""

    def __init__(self, source: str, live: bool, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.source = source
        self.live = live

    def on_mount(self) -> None:
        if self.live:
            self.set_interval(0.5, self._count_refused)

    def _count_refused(self) -> None:
        source = getattr(getattr(self.app, "collector", None), "source", None)
        refused = getattr(source, "refused", 0)
        if isinstance(refused, int) and refused != self.refused:
            self.refused = refused

    def drawn_from(self, view: View) -> tuple[object, ...]:
        return (id(view),)  # counters, ranks, rate: every snapshot may change the line

    def render(self) -> RenderableType:
        analysis = self.view.analysis
        return status_text(self.view.snapshot, source=self.source, live=self.live, lag_s=self.lag_s,
                           paused=self.view.paused, shown_iteration=analysis.iteration if analysis else None,
                           job_exited=self.job_exited, refused=self.refused, ended_at=self.ended_at,
                           width=self.content_size.width)
