"""The telemetry panel: the job's hosts and GPUs as its ranks report them, or the monitor's own machine."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from textual.reactive import reactive
from textual.widget import Widget

from dagtop.io.telemetry import TelemetrySample
from dagtop.ui.renderables.telemetry import panel_text, panel_title
from instrument import wire


class Telemetry(Widget):
    """Redrawn when new figures come (every couple of seconds); its title says whose figures they are."""

    job: reactive[tuple[wire.Telemetry, ...]] = reactive((), layout=False)
    """Each rank's latest telemetry frame, from the collector's newest snapshot; empty while the job sends none."""
    sample: reactive[TelemetrySample | None] = reactive(None, layout=False)
    """The monitor's own machine: shown only while the job sends no telemetry; None until the first (or in replay)."""

    def __init__(self, *, live: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.live = live
        """False in replay: the monitor's machine has nothing to do with the recorded job."""

    def on_mount(self) -> None:
        self._retitle()

    def watch_job(self) -> None:
        self._retitle()

    def watch_sample(self) -> None:
        self._retitle()

    def on_resize(self) -> None:
        self._retitle()

    def _retitle(self) -> None:
        self.border_title = panel_title(self.job, self.sample, max(self.outer_size.width - 2, 0) or None)  # corners

    def render(self) -> RenderableType:
        return panel_text(self.job, self.sample, live=self.live, width=self.size.width, height=self.size.height)
