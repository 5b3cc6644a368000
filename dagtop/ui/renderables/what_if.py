"""The what-if panel: the model's predicted iteration time and speedup for each change, best first."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from dagtop.model.snapshot import IterationAnalysis
from dagtop.ui.palette import colour

CHANGE_EXPLAINED: dict[str, str] = {
    "all-reduce ×0.5": "every collective takes half as long (faster network, compression)",
    "all-reduce ×2": "every collective takes twice as long (a slower or busier network)",
    "perfect overlap": "communication entirely hidden under computation",
    "I/O hidden": "data loading costs nothing on the critical path (prefetching, more workers)",
    "straggler at median": "the straggler rank runs as fast as the median rank",
    "2N workers": "twice the ranks: collectives cost more per the fitted α-β ring model",
}
"""What each of the model's changes means, for the details screen."""

_CHANGE_CATEGORY = {"all-reduce": "allreduce", "perfect overlap": "allreduce", "I/O": "io", "straggler": "other",
                    "2N": "allreduce"}


def _category_of(change: str) -> str:
    return next((c for prefix, c in _CHANGE_CATEGORY.items() if change.startswith(prefix)), "compute")


def speedup_bar(speedup: float, width: int) -> Text:
    """Speedup above 1 as a bar: one cell per ``1/width`` of doubling, capped at ``width``."""
    cells = max(0, min(width, round((speedup - 1.0) * width)))
    return Text("▇" * cells, style="green" if speedup > 1.005 else "dim")


def what_if_table(analysis: IterationAnalysis, width: int, explain: bool = False) -> Table:
    """Rows: now (measured and modelled), then each change by predicted speedup, best first."""
    table = Table(box=box.SIMPLE_HEAD, expand=True, padding=(0, 1), show_edge=False, pad_edge=False)
    table.add_column("change", no_wrap=True)
    table.add_column("iter ms", justify="right", no_wrap=True)
    table.add_column("speedup", justify="right", no_wrap=True)
    bar_w = max(0, min(12, width - 40))
    if bar_w:
        table.add_column("", no_wrap=True, width=bar_w)
    if explain:
        table.add_column("what it means", overflow="fold")
    now = [Text("now (model)", style="bold"), f"{analysis.predicted_ms:.1f}", "×1.00"]
    table.add_row(*now, *([""] if bar_w else []), *(["measured " + f"{analysis.measured_ms:.1f} ms"] if explain else []))
    for w in sorted(analysis.what_if, key=lambda w: -w.speedup):
        cells: list[Text | str] = [Text(w.change, style=colour(_category_of(w.change))), f"{w.iteration_ms:.1f}",
                                   Text(f"×{w.speedup:.2f}", style="bold green" if w.speedup > 1.05 else "")]
        if bar_w:
            cells.append(speedup_bar(w.speedup, bar_w))
        if explain:
            cells.append(CHANGE_EXPLAINED.get(w.change, ""))
        table.add_row(*cells)
    return table
