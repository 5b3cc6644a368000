"""The advice drawn at the width it is given (no App needed): the best change first, the ranked changes, fix against
buy per epoch, the waste so far, then each change with what to write and why."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from dagtop.model.advice import Advice, Confidence
from dagtop.model.advice_text import (
    CONFIDENCE_KEY,
    candidate_rows,
    cost_rows,
    little_line,
    lower_bound_key,
    waste_line,
)
from dagtop.model.cost import FixOrBuy

NARROW = 90
"""Below this width the table of changes leaves out the ranges (each change's own lines give its range)."""
CONFIDENCE_STYLE = {Confidence.VALIDATED: "green", Confidence.LOWER: "yellow", Confidence.WITHHELD: "dim"}
"""How a confidence is coloured: validated green, lower (with a ?) yellow, withheld dim."""


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], styles: list[str] | None = None) -> Table:
    """Right-aligned figures after a first column that wraps (a change's name) where the width is short."""
    t = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for i, name in enumerate(header):
        t.add_column(name, justify="left" if i == 0 else "right", overflow="fold", no_wrap=i > 0,
                     ratio=1 if i == 0 else None)
    for n, row in enumerate(rows):
        t.add_row(*row, style=styles[n] if styles else None)
    return t


class AdviceDetails:
    """The advice as a Rich renderable."""

    def __init__(self, advice: Advice, priced: FixOrBuy) -> None:
        self.advice = advice
        self.priced = priced

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        a, p = self.advice, self.priced
        head = Text(a.headline(), style="bold" if a.best is not None else "")
        if a.held:
            yield Group(head, Text(""), Text(waste_line(p), style="dim"), Text(""),
                        Text("Press escape or a to close.", style="dim"))
            return
        parts: list[RenderableType] = [
            head,
            Text(f"over {a.iterations} steady iterations (to {a.last_iteration}): step {a.step_ms:.1f} ms measured, "
                 f"the DAG replays it within {a.replay_error * 100:.1f} %"
                 + (f"; {a.without_dagtop}" if a.without_dagtop else ""), style="dim"),
            Text(""),
        ]
        rows = candidate_rows(a)
        styles = [CONFIDENCE_STYLE[Confidence(r[4].rstrip("?"))] for r in rows]
        if rows:
            header: tuple[str, ...] = ("change", "ms/step", "range", "throughput", "confidence")
            shown: Sequence[tuple[str, ...]] = rows
            if options.max_width < NARROW:  # the ranges are in each change's lines below
                header, shown = (header[0], header[1], header[3], "conf."), [(r[0], r[1], r[3], r[4]) for r in rows]
            parts.append(_table(header, shown, styles))
        if lower_bound_key(a):
            parts.append(Text(f"{lower_bound_key(a)} (why: with the change below)", style="dim"))
        if a.little:
            parts.append(Text(little_line(a), style="dim"))
        if a.withheld:
            parts.append(Text("not predicted: " + ", ".join(c.title for c in a.withheld) + " (why: at the end)",
                              style="dim"))
        parts.append(Text(""))
        if p.now is not None and p.epoch is not None:
            price = f", ${p.terms.gpu_hour_price:g}/GPU-h" if p.terms.gpu_hour_price is not None else \
                ", no price (--gpu-hour-price)"
            parts.append(Text(f"fix vs buy, per epoch: {p.epoch.steps} steps ({p.epoch.source}{price})", style="bold"))
            parts.append(_table(("", "epoch", "GPU-h", "cost", "vs now"), cost_rows(p)))
        else:
            parts.append(Text(f"fix vs buy: {p.unknown}", style="dim"))
        parts += [Text(waste_line(p)), Text("")]
        for n, c in enumerate((*a.fixes, *a.buys), 1):
            style = CONFIDENCE_STYLE[c.confidence]
            parts.append(Text.assemble((f"{n}. {c.title}", f"bold {style}"), (f" · {c.kind}", "dim")))
            if c.step_ms is not None and c.range_ms is not None and c.lower_bound:
                parts.append(Text(f"predicted at most {c.step_ms:.1f} ms/step (replayed {c.range_ms[0]:.1f}–"
                                  f"{c.range_ms[1]:.1f}), throughput at least {c.gain.lstrip('≥')}; {c.confidence} "
                                  "confidence"))
            elif c.step_ms is not None and c.range_ms is not None:
                parts.append(Text(f"predicted {c.step_ms:.1f} ms/step ({c.range_ms[0]:.1f}–{c.range_ms[1]:.1f}), "
                                  f"throughput {c.gain}; {c.confidence} confidence"))
            parts.append(Text(c.change, style="cyan"))
            parts.append(Text(f"evidence: {c.evidence}", style="dim"))
            if c.caveat:
                parts.append(Text(f"caveat: {c.caveat}", style="yellow"))
            if c.lower_bound:
                parts.append(Text(f"at least: {c.lower_bound}", style="yellow"))
            if c.doubt:
                parts.append(Text(f"lower confidence: {c.doubt}", style="yellow"))
        for c in a.withheld:
            parts.append(Text.assemble((f"not predicted: {c.title}", "bold"), (f" · {c.kind}: {c.doubt}", "dim")))
        parts += [Text(""), Text("ms/step and range: the step with the change (its 95 % interval over the window, "
                                 "widened by the network fit's uncertainty); throughput: samples/s against now. "
                                 f"{CONFIDENCE_KEY}.", style="dim"),
                  Text("Press escape or a to close.", style="dim")]
        yield Group(*parts)
