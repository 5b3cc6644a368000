"""One colour per task category, used by every panel and the legend, so a colour means the same thing everywhere."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

CATEGORY_COLOURS: dict[str, str] = {
    "io": "#e5a50a",
    "pcie": "#c061cb",
    "compute": "#57b85f",
    "allreduce": "#3d8fe8",
    "other": "#8a8a8a",
}
"""Category → colour. Chosen to stay distinct for the common colour-blindnesses against a dark background."""

CATEGORY_LABELS: dict[str, str] = {
    "io": "io",
    "pcie": "pcie",
    "compute": "compute",
    "allreduce": "all-reduce",
    "other": "other",
}
"""Category → the word the screen uses for it."""

STACK_ORDER: tuple[str, ...] = ("io", "pcie", "compute", "allreduce", "other")
"""Order of categories in stacks and legends: the order they run in within an iteration."""

STRAGGLER_COLOUR = "#f66151"
"""Marks the straggler rank and anything that is wrong (a dead demo job, rejected frames)."""

FOCUS_STYLE = Style(reverse=True, bold=True)
"""The focused rank's label."""


def colour(category: str) -> str:
    """The colour of ``category`` (grey for a category the palette does not know)."""
    return CATEGORY_COLOURS.get(category, CATEGORY_COLOURS["other"])


def label(category: str) -> str:
    """The word for ``category``."""
    return CATEGORY_LABELS.get(category, category)


def legend(shares: dict[str, float] | None = None) -> Text:
    """``■ io  ■ pcie  ■ compute …``, each with its share of the critical path when ``shares`` is given."""
    text = Text()
    for category in STACK_ORDER:
        if text:
            text.append("  ")
        text.append("■ ", style=colour(category))
        text.append(label(category))
        if shares is not None:
            text.append(f" {shares.get(category, 0.0) * 100:.0f} %", style="bold")
    return text
