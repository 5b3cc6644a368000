"""The per-rank table: each rank's iteration time, its time per category and how far it is from the median."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from dagtop.model.snapshot import IterationAnalysis, RankRow
from dagtop.ui.palette import FOCUS_STYLE, STRAGGLER_COLOUR, colour, label


def signed_ms(value: float, digits: int = 1) -> str:
    """``+12.3`` / ``-4.5``; a value that rounds to zero is ``0.0``, never ``-0.0``."""
    text = f"{value:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def visible_rows(rows: Sequence[RankRow], limit: int, focus_rank: int | None = None) -> tuple[list[RankRow], bool]:
    """The rows to draw in ``limit`` lines: all of them by rank when they fit, else the slowest first.

    Returns:
        (rows, sorted_by_deviation). The focused rank is always kept, and comes first.
    """
    if len(rows) <= limit:
        return sorted(rows, key=lambda r: (r.rank != focus_rank, r.rank)), False
    slowest = sorted(rows, key=lambda r: (r.rank != focus_rank, not r.straggler, -r.deviation_ms, r.rank))
    return slowest[: max(limit, 1)], True


def rank_table(analysis: IterationAnalysis, height: int, width: int, focus_rank: int | None = None,
               rows: Sequence[RankRow] | None = None, title: str | None = None) -> Table:
    """A Rich table for ``height`` lines (header included); narrow widths leave out pcie and other.

    ``rows`` (with its ``title``) are the rows to draw, chosen by the caller (a sorted, scrolled page); by default
    :func:`visible_rows` chooses."""
    wide = width >= 66
    tight = width < 50
    if rows is None:
        rows, slowest_first = visible_rows(analysis.per_rank, max(height - 2, 1), focus_rank)
        title = "slowest first" if slowest_first else None
        if slowest_first:
            rows = rows[: max(height - 3, 1)]  # the title takes a line
    table = Table(box=box.SIMPLE_HEAD, expand=True, padding=(0, 1), show_edge=False, pad_edge=False, collapse_padding=tight,
                  title=title, title_style="dim", title_justify="right")
    short = {"io": "io", "pcie": "pcie", "compute": "cmp", "allreduce": "a-r", "other": "oth"}
    table.add_column("r" if tight else "rank", justify="right", no_wrap=True)
    table.add_column("iter" if tight else "iter ms", justify="right", no_wrap=True)
    columns = ["io", "pcie", "compute", "allreduce", "other"] if wide else ["io", "compute", "allreduce"]
    for c in columns:
        heading = short[c] if tight else (label(c) if c != "allreduce" else "all-red")
        table.add_column(Text(heading, style=colour(c)), justify="right", no_wrap=True)
    # Every rank of a synchronous job takes the same wall time per iteration: the spread is in the work done.
    table.add_column("Δbusy" if tight else "Δ busy", justify="right", no_wrap=True)
    for r in rows:
        values = {"io": r.io_ms, "pcie": r.pcie_ms, "compute": r.compute_ms, "allreduce": r.allreduce_ms,
                  "other": r.other_ms}
        rank_style = FOCUS_STYLE if r.rank == focus_rank else (f"bold {STRAGGLER_COLOUR}" if r.straggler else "")
        deviation = Text(signed_ms(r.deviation_ms, 0 if tight else 1),
                         style=f"bold {STRAGGLER_COLOUR}" if r.straggler else "")
        # The straggler mark rides in the rank cell: a column of its own is the first one Rich squeezes away.
        # Its colour goes on the mark's span alone: as the Text's own style it would colour every rank number.
        rank = Text()
        if r.straggler:
            rank.append("◀ ", style=f"bold {STRAGGLER_COLOUR}")
        rank.append(str(r.rank), style=rank_style)
        fmt = "{:.0f}" if tight else "{:.1f}"
        table.add_row(rank, fmt.format(r.iteration_ms),
                      *(fmt.format(values[c]) for c in columns), deviation)
    return table
