"""The what-if panel: the model's predicted iteration time and throughput for each change, best first."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis, WhatIf
from dagtop.ui.palette import colour


def speedup_bar(speedup: float, width: int) -> Text:
    """Speedup above 1 as a bar: one cell per ``1/width`` of doubling, capped at ``width``."""
    cells = max(0, min(width, round((speedup - 1.0) * width)))
    return Text("▇" * cells, style="green" if speedup > 1.005 else "dim")


def efficiency_text(w: WhatIf) -> Text:
    """`` (77 %)``: the share of perfect scaling, for a change that adds workers; empty otherwise."""
    return Text(f" ({w.efficiency * 100:.0f} %)" if w.change.workers > 1 else "", style="dim")


def throughput_text(w: WhatIf, with_efficiency: bool = True) -> Text:
    """``×1.36``; with more workers also the scaling efficiency, ``×1.54 (77 %)``: per-iteration time alone
    would read as "more GPUs make it slower" under weak scaling."""
    text = Text(f"×{w.throughput:.2f}", style="bold green" if w.throughput > 1.05 else "")
    if with_efficiency:
        text.append_text(efficiency_text(w))
    return text


def what_if_table(analysis: IterationAnalysis, width: int, explain: bool = False) -> Table:
    """Rows: now (measured and modelled), then each change by predicted throughput, best first."""
    table = Table(box=box.SIMPLE_HEAD, expand=True, padding=(0, 1), show_edge=False, pad_edge=False)
    table.add_column("change", no_wrap=True)
    table.add_column("ms/it", justify="right", no_wrap=True, min_width=5)
    table.add_column("throughput", justify="right", no_wrap=True)
    narrow = width < 50  # the efficiency rides with the change's name, where the column has room for it
    bar_w = max(0, min(12, width - 46))
    if bar_w:
        table.add_column("", no_wrap=True, width=bar_w, overflow="crop")  # a bar squeezed is cut, not "…"
    if explain:
        table.add_column("what it means", overflow="fold")
    now: list[Text | str] = [Text(str(Change.IDENTITY), style="bold"), f"{analysis.predicted_ms:.1f}", "×1.00"]
    table.add_row(*now, *([""] if bar_w else []),
                  *([f"measured {analysis.measured_ms:.1f} ms; {Change.IDENTITY.assumption}"] if explain else []))
    for w in sorted(analysis.what_if, key=lambda w: -w.throughput):
        change = Text(w.label, style=colour(w.change.category))
        if w.change.doubt:  # not validated within 10 % of a real re-run: the screen says why
            change.append(" ?", style="yellow")
        if narrow:
            change.append_text(efficiency_text(w))
        cells: list[Text | str] = [change, f"{w.iteration_ms:.1f}", throughput_text(w, not narrow)]
        if bar_w:
            cells.append(speedup_bar(w.throughput, bar_w))
        if explain:
            cells.append(w.change.assumption)
        table.add_row(*cells)
    return table
