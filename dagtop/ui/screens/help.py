"""The help screen: keys, what each panel shows, glyphs and colours."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.keys import format_key
from textual.screen import ModalScreen
from textual.widgets import Static

from dagtop.ui.keys import SCREEN_KEYS
from dagtop.ui.palette import legend


def key_rows(bindings: Iterable[Binding]) -> tuple[tuple[str, str], ...]:
    """(keys, meaning) per binding: each of its keys as Textual shows it (``p, space``), and its tooltip."""
    return tuple((", ".join(format_key(key.strip()) for key in b.key.split(",")), b.tooltip) for b in bindings)


KEYS = key_rows(SCREEN_KEYS)
"""Every key the main screen answers, as the help lists it."""

PANELS = (
    ("status", "source, ranks connected / expected, iteration shown, iterations/s, lag, frames lost"),
    ("verdict", "steady bottleneck and late rank over 20 iterations, then the iteration shown"),
    ("timeline", "a Gantt chart of the iteration: a row per rank and lane, collectives, critical path"),
    ("ranks", "ms per category per rank; Δ busy: its work minus the others' median; ◀ straggler"),
    ("what if…", "the model's predicted ms per iteration and throughput for each change (w: details)"),
    ("history", "recent iterations' times, each bar stacked by its critical-path categories"),
    ("telemetry", "the job's hosts and GPUs as its ranks report them (else this machine, live only)"),
)
"""Every panel of the main screen and what it shows."""

TIMELINE_GLYPHS = ("█ critical path  ▒ off the path  · waiting for other ranks  ━ collective on every rank. "
                   "The last row follows the critical path and names the rank it runs on, or the collective "
                   "(all-gather, reduce-scatter: FSDP's, by unit).")
"""How to read the timeline's glyphs."""


def help_renderable() -> RenderableType:
    """The help's whole content, drawn at whatever width the screen gives it (no App needed).

    One grid for keys and panels, so both name columns line up and a long meaning wraps under itself.
    """
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for heading, rows in (("Keys", KEYS), ("Panels", PANELS)):
        grid.add_row(Text(heading, style="bold underline"), "")
        for name, meaning in rows:
            grid.add_row(name, meaning)
        grid.add_row("", "")
    return Group(
        Text("dagtop: what holds each iteration of your job back", style="bold"),
        Text(""),
        grid,
        Text("Timeline", style="bold underline"),
        Text(TIMELINE_GLYPHS),
        Text(""),
        Text.assemble(("Colours", "bold underline"), "  ", legend()),
        Text(""),
        Text("Press escape or ? to close.", style="dim"),
    )


class HelpScreen(ModalScreen[None]):
    """Modal; escape, ? or q closes it; ↑ ↓ scroll it where the terminal is too short for all of it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = "help"
            box.border_subtitle = "escape close · ↑ ↓ scroll"
            yield Static(help_renderable(), id="help-text")
