"""The telemetry panel: the monitor host's CPU, memory, disk, network and NVIDIA GPUs."""

from __future__ import annotations

from rich.console import RenderableType
from textual.reactive import reactive
from textual.widget import Widget

from dagtop.telemetry import TelemetrySample
from dagtop.ui.renderables.telemetry import telemetry_text


class Telemetry(Widget):
    """Redrawn when a new sample comes (about once a second)."""

    sample: reactive[TelemetrySample | None] = reactive(None, layout=False)
    """The latest sample; None until the first."""

    def render(self) -> RenderableType:
        return telemetry_text(self.sample)
