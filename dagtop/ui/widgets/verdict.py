"""The verdict: the headline naming what holds the job back, the critical-path bar and the legend."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from dagtop.ui.palette import legend
from dagtop.ui.renderables.verdict import critical_path_bar, headline
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class Verdict(Panel):
    """Three lines: the headline (steady over recent iterations, then the one on screen), the iteration's critical
    path in proportion, the legend with its shares."""

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        line = headline(a.steady, a, self.content_size.width)
        line.no_wrap, line.overflow = True, "ellipsis"  # one line always: the bar and the legend keep their rows
        return Group(line, critical_path_bar(a, self.content_size.width), legend(dict(a.shares)))

    def draw_empty(self) -> RenderableType:
        return Group(Text(self.view.waiting_hint or "waiting for the first iteration…", style="bold"),
                     Text(""), legend())
