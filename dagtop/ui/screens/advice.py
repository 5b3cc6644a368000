"""The advice screen: what to change in the job, ranked, and what it is worth against buying GPUs."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dagtop.model.advice import Advice
from dagtop.model.cost import FixOrBuy
from dagtop.ui.renderables.advice import AdviceDetails


class AdviceScreen(ModalScreen[None]):
    """Modal over the snapshot shown (as of its iteration); escape, a or q closes it; ↑ ↓ scroll it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,a,q", "dismiss", "Close")]

    def __init__(self, advice: Advice, priced: FixOrBuy) -> None:
        super().__init__()
        self.advice = advice
        self.priced = priced

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="advice-box") as box:
            shown = f" · as of iteration {self.advice.last_iteration}" if self.advice.last_iteration >= 0 else ""
            box.border_title = f"advice: what to change{shown}"
            box.border_subtitle = "escape close · ↑ ↓ scroll"
            yield Static(AdviceDetails(self.advice, self.priced), id="advice-text")
