"""The rank picker: choose the rank to focus, or none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from dagtop.model.snapshot import RankRow
from dagtop.ui.palette import STRAGGLER_COLOUR
from dagtop.ui.renderables.rank_table import signed_ms

NO_FOCUS = "none"
"""Option id meaning: focus no rank."""


def rank_option(row: RankRow) -> Text:
    """``rank 1      191.8 ms  Δ busy  +137.5 ms  ◀ straggler``: 53 cells at most (ranks up to 99 999), so that
    the option stays on one line in the picker's 70-cell box (the title says what Δ busy is)."""
    text = Text(f"rank {row.rank:<5} {row.iteration_ms:8.1f} ms  Δ busy {signed_ms(row.deviation_ms):>8} ms")
    if row.straggler:
        text.append("  ◀ straggler", style=f"bold {STRAGGLER_COLOUR}")
    return text


class RankPicker(ModalScreen[int | None]):
    """Dismisses with the chosen rank, None for no focus; escape keeps the current focus (dismisses with -1)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, rows: Sequence[RankRow], current: int | None) -> None:
        super().__init__()
        self.rows = rows
        self.current = current

    def compose(self) -> ComposeResult:
        options = [Option("all ranks (no focus)", id=NO_FOCUS)]
        options += [Option(rank_option(r), id=str(r.rank)) for r in sorted(self.rows, key=lambda r: r.rank)]
        with Vertical(id="picker-box"):
            yield Static("Focus a rank (enter), escape to cancel. Δ busy: the rank's work (io, pcie, compute) "
                         "over the other ranks' median.", id="picker-title")
            yield OptionList(*options, id="picker")

    def on_mount(self) -> None:
        picker = self.query_one(OptionList)
        if self.current is not None:
            index = next((i for i, r in enumerate(sorted(self.rows, key=lambda r: r.rank)) if r.rank == self.current),
                         None)
            picker.highlighted = None if index is None else index + 1
        else:
            picker.highlighted = 0
        picker.focus()

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        option_id = event.option.id
        self.dismiss(None if option_id in (None, NO_FOCUS) else int(option_id))

    def action_cancel(self) -> None:
        self.dismiss(-1)
