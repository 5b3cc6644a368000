"""The what-if details: every change the model replays, its predicted time and throughput, and what it assumes."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis
from dagtop.model.whatif import decomposition
from dagtop.ui.palette import colour
from dagtop.ui.renderables.what_if import what_if_table

COLUMNS = (
    ("ms/it", "the iteration time the model predicts with the change"),
    ("throughput", ("samples/s with the change over samples/s now (×1.20: 20 % more); with more workers, in "
                    "brackets, the share of perfect scaling")),
)
"""How to read the table's columns (the change is named in the first)."""


def _grid() -> Table:
    """Two columns: a name, and a meaning that wraps under itself."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


class WhatIfDetails:
    """A Rich renderable of the details at the width it is given (no App needed): the what-if table, how to read
    it, then each change with what it means and what the model assumes to predict it."""

    def __init__(self, analysis: IterationAnalysis) -> None:
        self.analysis = analysis

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        a = self.analysis
        intro = Text(f"Iteration {a.iteration}: measured {a.measured_ms:.1f} ms; the model replays its DAG in "
                     f"{a.predicted_ms:.1f} ms. Each change is replayed on the same DAG, best first.", style="bold")
        columns = _grid()
        for name, meaning in COLUMNS:
            columns.add_row(Text(name, style="bold"), meaning)
        assumes = _grid()
        assumes.add_row(Text(str(Change.IDENTITY), style="bold"), Change.IDENTITY.assumption)
        for w in sorted(a.what_if, key=lambda w: -w.throughput):
            assumes.add_row(Text(w.label, style=f"bold {colour(w.change.category)}"), w.change.assumption)
        yield Group(intro, Text(""), what_if_table(a, options.max_width), Text(""), columns, Text(""),
                    Text("What each change assumes", style="bold underline"), assumes, Text(""),
                    Text("Where it came from", style="bold underline"), _decomposition(a), _interference(a),
                    _scaling(a),
                    Text(""), _confidence(a), _lower_bounds(a), _unpredictable(a), Text(""),
                    Text("Every other task keeps its measured duration and order, except compute that ran under a "
                         "collective: a change to communication rescales it by the interference fitted above.",
                         style="dim"),
                    Text(""), Text("Press escape or w to close.", style="dim"))


def _decomposition(a: IterationAnalysis) -> Text:
    """The iteration in Shi et al.'s terms, to compare with the paper's tables."""
    terms = decomposition(a.critical_path)
    return Text("per iteration (Shi et al., on the critical path; t_c exposed): "
                + "  ".join(f"{k} {v:.1f}" for k, v in terms.items() if v > 0 or k != "t_other") + " ms")


def _interference(a: IterationAnalysis) -> Text:
    if not a.interference:
        return Text("interference: not fitted yet (no block has run both more and less under a collective); "
                    "changes to communication hold compute fixed", style="dim")
    return Text("interference: " + "; ".join(f.describe() for f in a.interference)
                + ". Applied where a change adds or removes overlap.")


def _scaling(a: IterationAnalysis) -> RenderableType:
    """The α-β fit the scaling changes rest on, and how far their predictions move within its uncertainty."""
    if a.network is None:
        return Text("network: no α-β fit yet (one rank, or no collective timed past warm-up); no scaling "
                    "what-ifs", style="dim")
    rows = _grid()
    for w in a.what_if:
        if w.bounds_ms is None:
            continue
        fast, slow = w.bounds_ms
        workers = w.change.workers
        low, high = a.predicted_ms / slow * workers, a.predicted_ms / fast * workers
        said = f"throughput ×{w.throughput:.3f}, ×{low:.3f} to ×{high:.3f} with β ± 1 s.e."
        if workers > 1:
            said += f" (scaling efficiency {low / workers * 100:.1f}–{high / workers * 100:.1f} %)"
        rows.add_row(Text(w.label, style=colour(w.change.category)), said)
    return Group(Text(f"network: {a.network.describe()}."), rows)


def _unpredictable(a: IterationAnalysis) -> RenderableType:
    """The changes the model cannot predict on this job (— in the table), each with why."""
    return _reasons("Not predictable on this job (— in the table)",
                    [(w.label, w.unpredictable) for w in a.what_if if not w.predictable])


def _lower_bounds(a: IterationAnalysis) -> RenderableType:
    """The changes whose gain is a lower bound on this job (≥ in the table), each with why."""
    return _reasons("At least this (≥ in the table)",
                    [(w.label, w.lower_bound) for w in a.what_if if w.lower_bound and w.predictable])


def _reasons(title: str, rows: list[tuple[str, str]]) -> RenderableType:
    """A titled list of changes, each with its reason; nothing when there are none."""
    if not rows:
        return Text("")
    reasons = _grid()
    for label, why in rows:
        reasons.add_row(Text(label, style="bold"), Text(why))
    return Group(Text(""), Text(title, style="bold"), reasons)


def _confidence(a: IterationAnalysis) -> RenderableType:
    """The changes whose predictions were not validated within 10 % of a real re-run, with the reason."""
    low = [w for w in a.what_if if w.change.doubt and w.predictable]
    if not low:
        return Text("Every change shown was validated within 10 % of a real re-run (benchmarks/validate_whatif.py).",
                    style="dim")
    reasons = _grid()
    for w in low:
        reasons.add_row(Text(w.label, style="yellow"), Text(w.change.doubt, style="yellow"))
    return Group(Text("Lower confidence (? in the table)", style="bold yellow"), reasons)


class WhatIfScreen(ModalScreen[None]):
    """Modal over the iteration shown; escape, w or q closes it; ↑ ↓ scroll it on a short terminal."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,w,q", "dismiss", "Close")]

    def __init__(self, analysis: IterationAnalysis) -> None:
        super().__init__()
        self.analysis = analysis

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="what-if-box") as box:
            box.border_title = f"what if… iteration {self.analysis.iteration}"
            box.border_subtitle = "escape close · ↑ ↓ scroll"
            yield Static(WhatIfDetails(self.analysis), id="what-if-text")
