"""The what-if panel: the model's predicted iteration time and throughput for each change, best first."""

from __future__ import annotations

import math

from rich import box
from rich.table import Table
from rich.text import Text

from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis, WhatIf
from dagtop.ui.palette import colour


def speedup_bar(speedup: float, width: int) -> Text:
    """Speedup above 1 as a bar: one cell per ``1/width`` of doubling, capped at ``width`` (none for no figure)."""
    if math.isnan(speedup):
        return Text("")
    cells = max(0, min(width, round((speedup - 1.0) * width)))
    return Text("▇" * cells, style="green" if speedup > 1.005 else "dim")


def efficiency_text(w: WhatIf) -> Text:
    """`` (77 %)``: the share of perfect scaling, for a change that adds workers; empty otherwise."""
    return Text(f" ({w.efficiency * 100:.0f} %)" if w.change.workers > 1 else "", style="dim")


def throughput_text(w: WhatIf, with_efficiency: bool = True) -> Text:
    """``×1.36``; with more workers also the scaling efficiency, ``×1.54 (77 %)``: per-iteration time alone
    would read as "more GPUs make it slower" under weak scaling. ``—`` for a change the model cannot predict;
    ``≥×1.36`` for a gain that is a lower bound on this job."""
    if not w.predictable:
        return Text("—", style="dim")
    at_least = "≥" if w.lower_bound else ""  # the details say why the gain is at least this
    text = Text(f"{at_least}×{w.throughput:.2f}", style="bold green" if w.throughput > 1.05 else "")
    if with_efficiency:
        text.append_text(efficiency_text(w))
    return text


def what_if_table(analysis: IterationAnalysis, width: int, height: int | None = None) -> Table:
    """Rows: now (measured and modelled), then each change by predicted throughput, best first, and last the changes
    the model cannot predict on this job (``—``: the details say why).

    The figures keep their width; where the change names do not fit, a name is shortened with "…" before its
    ``?`` (not validated) and its scaling efficiency, which always show. In ``height`` lines (header and rule
    included), the changes that do not fit are counted on the last line instead: ``+3 more · w``."""
    changes = sorted(analysis.what_if, key=lambda w: (not w.predictable, -w.throughput if w.predictable else 0.0))
    hidden = 0
    if height is not None and len(changes) + 1 > height - 2:  # the header and its rule take two lines
        shown = max(0, height - 4)  # "now", the changes that fit, and the line that counts the rest
        hidden = len(changes) - shown
        changes = changes[:shown]
    narrow = width < 50  # the efficiency rides with the change's name, where the column has room for it
    names: list[tuple[Text, Text]] = [(Text(str(Change.IDENTITY), style="bold"), Text())]
    for w in changes:
        marks = Text(" ?", style="yellow") if w.change.doubt and w.predictable else Text()  # not validated within 10 %
        if narrow and w.predictable:
            marks.append_text(efficiency_text(w))
        names.append((Text(w.label, style=colour(w.change.category)), marks))
    ms = [f"{analysis.predicted_ms:.1f}",
          *(f"{'≤' if w.lower_bound else ''}{w.iteration_ms:.1f}" if w.predictable else "—" for w in changes)]
    throughput = [Text("×1.00"), *(throughput_text(w, not narrow) for w in changes)]
    ms_w = max(len("ms/it"), *map(len, ms))
    figures_w = max(t.cell_len for t in throughput)
    longest = max(name.cell_len + marks.cell_len for name, marks in names)
    gap = 3  # between two columns: padding (0, 1) each side and the box's blank divider; none at the edges
    header = "throughput" if width - ms_w - len("throughput") - 2 * gap >= longest else "thrpt"
    throughput_w = max(figures_w, len(header))
    room = width - ms_w - throughput_w - 2 * gap  # for the names
    # The bar is what gives way first: whatever the names leave, up to 12 cells, none under 4.
    bar_w = min(12, room - longest - gap)
    bar_w = bar_w if bar_w >= 4 else 0

    table = Table(box=box.SIMPLE_HEAD, expand=True, padding=(0, 1), show_edge=False, pad_edge=False)
    table.add_column("change", no_wrap=True, overflow="crop")
    table.add_column("ms/it", justify="right", no_wrap=True, min_width=ms_w)
    table.add_column(header, justify="right", no_wrap=True, min_width=throughput_w)
    if bar_w:
        table.add_column("", no_wrap=True, width=bar_w, overflow="crop")  # a bar squeezed is cut, not "…"
    bars = [Text(""), *(speedup_bar(w.throughput, bar_w) for w in changes)]
    room -= bar_w + gap if bar_w else 0
    for (name, marks), ms_cell, throughput_cell, bar in zip(names, ms, throughput, bars, strict=True):
        if name.cell_len + marks.cell_len > room:
            name.truncate(max(1, room - marks.cell_len), overflow="ellipsis")
        cells: list[Text | str] = [name + marks, ms_cell, throughput_cell]
        if bar_w:
            cells.append(bar)
        table.add_row(*cells)
    if hidden:
        table.add_row(Text(f"+{hidden} more · w", style="dim italic"))
    return table
