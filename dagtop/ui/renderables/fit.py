"""One line that fits its width: its parts say shorter before anything is cut.

A line (the status line, the verdict's headline, a rank picker's option) is a row of parts, each with the forms
it can take, longest first; an empty form leaves the part out. :func:`fit_line` starts from every part's longest
form and, while the line is too wide, moves one part on to its next form, in the order the caller gives: what
matters least gives way first, words are shortened before figures are dropped. Only when every step is taken
and the line is still too wide is its end cut, with "…".
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text


def fit_line(parts: Sequence[Sequence[Text]], order: Sequence[int], width: int, sep: Text | str = "") -> Text:
    """The parts joined by ``sep`` (empty forms left out), shortened in ``order`` until at most ``width`` cells.

    Args:
        parts: each part's forms, longest first.
        order: indexes into ``parts``; each step moves that part on to its next form (a part at its last form
            stays there). A part may appear several times, interleaved with others.
        width: the cells there are.
        sep: what goes between two parts that are not left out.
    """
    choice = [0] * len(parts)
    joiner = Text(sep) if isinstance(sep, str) else sep

    def line() -> Text:
        return joiner.join(p[c] for p, c in zip(parts, choice) if p and p[c].cell_len)

    text = line()
    for i in order:
        if text.cell_len <= width:
            return text
        if choice[i] + 1 < len(parts[i]):
            choice[i] += 1
            text = line()
    if text.cell_len > width:
        text.truncate(max(width, 1), overflow="ellipsis")
    return text
