"""The per-rank panel: iteration and category times per rank, deviation from the median, the straggler."""

from __future__ import annotations

from rich.console import RenderableType

from dagtop.ui.renderables.rank_table import rank_table
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class RankTable(Panel):
    """All ranks when they fit, else the slowest first (the focused rank always)."""

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        return rank_table(a, self.content_size.height, self.content_size.width, view.focus_rank)
