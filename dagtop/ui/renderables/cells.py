"""Rows of coloured cells turned into Rich Text cheaply: one span per run of equal cells, not one per cell."""

from __future__ import annotations

from collections.abc import Iterable

from rich.style import Style
from rich.text import Text

Cell = tuple[str, Style | str]
"""One terminal cell: its glyph and its style."""


def cells_to_text(cells: Iterable[Cell]) -> Text:
    """Join cells into Text, merging runs of the same glyph and style."""
    text = Text()
    run_glyph, run = "", 0
    run_style: Style | str = ""
    for glyph, style in cells:
        if run and glyph == run_glyph and style == run_style:
            run += 1
            continue
        if run:
            text.append(run_glyph * run, style=run_style)
        run_glyph, run_style, run = glyph, style, 1
    if run:
        text.append(run_glyph * run, style=run_style)
    return text
