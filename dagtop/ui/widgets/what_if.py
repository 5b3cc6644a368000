"""The what-if panel: the model's predicted iteration time and speedup for each change."""

from __future__ import annotations

from rich.console import RenderableType

from dagtop.ui.renderables.what_if import what_if_table
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class WhatIf(Panel):
    """Best change first; ``w`` opens the details."""

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        return what_if_table(a, self.content_size.width, self.content_size.height)
