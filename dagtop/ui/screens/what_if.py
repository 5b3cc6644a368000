"""The what-if details: every change the model replays, its predicted time and speedup, and what it means."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from dagtop.model.snapshot import IterationAnalysis
from dagtop.ui.renderables.what_if import what_if_table


class WhatIfScreen(ModalScreen[None]):
    """Modal over the iteration shown; escape, w or q closes it."""

    BINDINGS = [Binding("escape,w,q", "dismiss", "Close")]

    def __init__(self, analysis: IterationAnalysis) -> None:
        super().__init__()
        self.analysis = analysis

    def compose(self) -> ComposeResult:
        a = self.analysis
        intro = Text(f"What if… iteration {a.iteration}: measured {a.measured_ms:.1f} ms, the DAG model replays it "
                     f"in {a.predicted_ms:.1f} ms; each change is replayed on the same DAG.\n", style="bold")
        intro.append("Every other task keeps its measured duration. Where communication shares cores with compute "
                     "(gloo on CPU), less of it would also speed compute up: the real gain can be larger.\n",
                     style="dim")
        with Vertical(id="what-if-box"):
            yield Static(Group(intro, what_if_table(a, 100, explain=True),
                               Text("\nPress escape or w to close.", style="dim")), id="what-if-text")
