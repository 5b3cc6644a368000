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
