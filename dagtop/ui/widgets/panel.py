"""The base of the data panels: holds the current :class:`View` and redraws from it, never recomposes."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from dagtop.ui.view import EMPTY_VIEW, View


class Panel(Widget):
    """A bordered panel drawing :attr:`view` with :meth:`draw`; subclasses implement ``draw``."""

    view: reactive[View] = reactive(EMPTY_VIEW, always_update=True, layout=False)
    """The view to draw; replaced whole by the app (always_update: frozen views are never compared field by field)."""

    def drawn_from(self, view: View) -> tuple[object, ...]:
        """What of ``view`` this panel draws, as a key: the app hands a new view only to a panel whose key it
        changes, so a snapshot with no new iteration (a hello, a counter) redraws no chart.

        Objects are keyed by ``id``: the panel's own view keeps the ones it shows alive, so an id cannot be reused
        while it is compared."""
        return (id(view.analysis), view.focus_rank, view.waiting_hint)

    def render(self) -> RenderableType:
        if self.view.analysis is None:
            return self.draw_empty()
        return self.draw(self.view)

    def draw(self, view: View) -> RenderableType:
        """Draw ``view`` (its analysis is not None) into ``self.content_size``."""
        raise NotImplementedError

    def draw_empty(self) -> RenderableType:
        """What to show before the first iteration."""
        return Text("")
