"""The verdict: the headline naming what holds the job back, the critical-path bar and the legend."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from dagtop.ui.palette import STRAGGLER_COLOUR, legend
from dagtop.ui.renderables.verdict import critical_path_bar, headline
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel


class Verdict(Panel):
    """Three lines: the headline (steady over recent iterations, then the one on screen), the iteration's critical
    path in proportion, the legend with its shares. While a rank is silent, gone or restarted, or the job has just
    restarted, or a second job publishes here, that takes the headline's place: ``rank 3 silent 42 s (last:
    backward layers.3) · ranks 0-2, 4-7 waiting in all-reduce …``."""

    def drawn_from(self, view: View) -> tuple[object, ...]:
        return (*super().drawn_from(view), _said(view))  # seconds silent: redrawn each second

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        line = _liveness(view) or headline(a.steady, a, self.content_size.width)
        line.no_wrap, line.overflow = True, "ellipsis"  # one line always: the bar and the legend keep their rows
        return Group(line, critical_path_bar(a, self.content_size.width), legend(dict(a.shares)))

    def draw_empty(self) -> RenderableType:
        return Group(_liveness(self.view) or Text(self.view.waiting_hint or "waiting for the first iteration…",
                                                  style="bold"), Text(""), legend())


def _said(view: View) -> str:
    return " · ".join(part for part in (view.snapshot.liveness.line(), view.snapshot.job_line) if part)


def _liveness(view: View) -> Text | None:
    said = _said(view)
    if not said:
        return None
    line = Text(said, style=f"bold {STRAGGLER_COLOUR}")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line
