"""The per-rank panel: iteration and category times per rank, deviation from the median, the straggler.

It sorts (``s`` cycles the column) and scrolls (↑ ↓ PgUp PgDn Home End), so a 1024-rank job can be read a page at a
time. The order is worked out once per iteration, sort and focus, not per redraw; a redraw builds the rows it draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from rich.console import RenderableType
from textual.reactive import reactive

from dagtop.model.snapshot import RankRow
from dagtop.ui.renderables.rank_table import rank_table, visible_rows
from dagtop.ui.view import View
from dagtop.ui.widgets.panel import Panel

SORTS: Final[dict[str, Callable[[RankRow], float]]] = {
    "auto": lambda r: 0.0,  # by rank when every rank fits, else the slowest first (the straggler, then Δ busy)
    "Δ busy": lambda r: -r.deviation_ms,
    "rank": lambda r: r.rank,
    "iter ms": lambda r: -r.iteration_ms,
    "io": lambda r: -r.io_ms,
    "compute": lambda r: -r.compute_ms,
    "all-red": lambda r: -r.allreduce_ms,
}
"""The sorts ``s`` cycles through, each a key (the most telling first: times descending)."""
_ORDER = tuple(SORTS)


class RankTable(Panel):
    """All ranks when they fit, else the slowest first (the focused rank always); sortable and scrollable."""

    sort: reactive[str] = reactive("auto")
    """The column sorted by (a key of :data:`SORTS`)."""
    scrolled: reactive[int] = reactive(0)
    """Rows scrolled past (the focused rank is the first row of every order)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._ordered_for: tuple[object, ...] = ()
        self._ordered: list[RankRow] = []
        self.rows_built = 0
        """Rows handed to the table in the last redraw (a test checks it stays with the rows shown)."""

    def cycle_sort(self) -> None:
        self.sort = _ORDER[(_ORDER.index(self.sort) + 1) % len(_ORDER)]
        self.scrolled = 0

    def scroll_rows(self, delta: int, pages: bool = False) -> None:
        """Scroll by ``delta`` rows, or pages; clamped to the rows there are."""
        step = self.page() if pages else 1
        total = len(self.view.analysis.per_rank) if self.view.analysis is not None else 0
        self.scrolled = min(max(self.scrolled + delta * step, 0), max(total - self.page(), 0))

    def page(self) -> int:
        """Rows a screen shows: the height less the header (2 lines) and the title."""
        return max(self.content_size.height - 3, 1)

    def ordered(self, view: View) -> list[RankRow]:
        """Every rank in the order drawn: the focused rank first, then by :attr:`sort`. Kept until the iteration,
        sort or focus changes."""
        a = view.analysis
        assert a is not None
        key = (a, self.sort, view.focus_rank, self.page())  # the analysis held, compared by identity
        held = self._ordered_for
        if not (held and held[0] is a and held[1:] == key[1:]):
            focus = view.focus_rank
            if self.sort == "auto":
                ordered = visible_rows(a.per_rank, self.page() + 1, focus)[0]
                if len(ordered) < len(a.per_rank):  # not all fit: the slowest first, as visible_rows orders them
                    ordered = sorted(a.per_rank, key=lambda r: (r.rank != focus, not r.straggler, -r.deviation_ms,
                                                                r.rank))
            else:
                by = SORTS[self.sort]
                ordered = sorted(a.per_rank, key=lambda r: (r.rank != focus, by(r), r.rank))
            self._ordered_for, self._ordered = key, ordered
        return self._ordered

    def draw(self, view: View) -> RenderableType:
        a = view.analysis
        assert a is not None
        height, width = self.content_size.height, self.content_size.width
        rows = self.ordered(view)
        page = self.page()
        if self.sort == "auto" and len(rows) <= page + 1:  # all fit (no title line): by rank
            self.rows_built = len(rows)
            return rank_table(a, height, width, view.focus_rank, rows=rows)
        offset = min(self.scrolled, max(len(rows) - page, 0))
        shown = rows[offset: offset + page]
        self.rows_built = len(shown)
        if self.sort == "auto" and offset == 0:  # the table as it always was
            return rank_table(a, height, width, view.focus_rank, rows=shown, title="slowest first")
        by = "slowest first" if self.sort == "auto" else f"by {self.sort}"
        title = f"{by} · {offset + 1}–{offset + len(shown)} of {len(rows)}"
        return rank_table(a, height, width, view.focus_rank, rows=shown, title=title)
