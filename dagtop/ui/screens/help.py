"""The help screen: keys, glyphs and colours."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from dagtop.ui.palette import legend

KEYS = (
    ("q", "quit"),
    ("p, space", "pause / resume the screen (collecting goes on)"),
    ("←  →", "previous / next iteration (← pauses)"),
    ("r", "focus a rank: its rows first and highlighted"),
    ("w", "what-if details: each change and what it means"),
    ("?", "this help"),
)
"""Every key the screen answers, as the help lists it."""


def help_text() -> Text:
    text = Text("dagtop: what holds each iteration of your job back\n\n", style="bold")
    for key, what in KEYS:
        text.append(f"  {key:<10}", style="bold")
        text.append(f"{what}\n")
    text.append("\nTimeline: ")
    text.append("█ critical path  ▒ off the path  · waiting for other ranks  ━ collective on every rank\n")
    text.append("The last row follows the critical path and names the rank it runs on.\n\n")
    text.append_text(legend())
    text.append("\n\nPress escape or ? to close.", style="dim")
    return text


class HelpScreen(ModalScreen[None]):
    """Modal; escape, ? or q closes it."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(help_text(), id="help-text")
