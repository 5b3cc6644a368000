"""``dagtop advise``: what to change in a recorded job and what it is worth, as text or JSON (docs/report.md).

The same advice is a section of ``dagtop report``, a screen of the live monitor (``a``) and Prometheus gauges; this
module words it for the two commands (:func:`advice_json` the JSON, :func:`write_advice` the text) from the rows and
lines all of them share (:mod:`dagtop.model.advice_text`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from dagtop.exits import Exit
from dagtop.model.advice import Advice, Candidate
from dagtop.model.advice_text import (
    CONFIDENCE_KEY,
    advice_of,
    candidate_rows,
    cost_rows,
    little_line,
    lower_bound_key,
    lower_bound_lines,
    terms_of,
    waste_line,
)
from dagtop.model.bucket_map import totals
from dagtop.model.cost import EpochCost, FixOrBuy


def _cost(e: EpochCost | None) -> dict[str, Any] | None:
    return None if e is None else {"hours": e.hours, "gpu_hours": e.gpu_hours, "dollars": e.dollars,
                                   "at_most": e.at_most}


def _candidate(c: Candidate, epoch: EpochCost | None) -> dict[str, Any]:
    return {"kind": str(c.kind), "title": c.title, "change": c.change, "setting": dict(c.setting),
            "step_ms": c.step_ms, "step_ms_range": list(c.range_ms) if c.range_ms else None, "speedup": c.speedup,
            "throughput": c.throughput, "workers": c.workers, "samples": c.samples, "efficiency": c.efficiency,
            "confidence": str(c.confidence), "doubt": c.doubt, "caveat": c.caveat, "evidence": c.evidence,
            "lower_bound": c.lower_bound or None, "epoch": _cost(epoch)}


def advice_json(advice: Advice, priced: FixOrBuy) -> dict[str, Any]:
    """The ``advice`` object of ``report --json`` and of ``advise --json`` (docs/report.md)."""
    epochs = {id(c): e for c, e in priced.rows}
    model = advice.buckets
    w = priced.waste
    return {
        "headline": advice.headline(),
        "held": advice.held or None,
        "iterations": advice.iterations,
        "needed": advice.needed,
        "step_ms": advice.step_ms,
        "replay_error": advice.replay_error,
        "shim_ms": advice.shim_ms,
        "best": advice.best.title if advice.best is not None else None,
        "fixes": [_candidate(c, epochs.get(id(c))) for c in advice.fixes],
        "buys": [_candidate(c, epochs.get(id(c))) for c in advice.buys],
        "withheld": [{"kind": str(c.kind), "title": c.title, "why": c.doubt} for c in advice.withheld],
        "little": [_candidate(c, None) for c in advice.little],
        "gpu_hour_price": priced.terms.gpu_hour_price,
        "epoch": None if priced.epoch is None else {"steps": priced.epoch.steps, "source": priced.epoch.source},
        "epoch_unknown": priced.unknown or None,
        "now": _cost(priced.now),
        "waste": {"iterations": w.iterations, "gpu_hours": w.gpu_hours, "communication": w.communication,
                  "loading": w.loading, "straggler": w.straggler,
                  "straggler_lower_bound": w.straggler_lower_bound or None},
        "buckets": None if model is None else {
            "now_bytes": totals(model.layout.sizes, model.layout.now), "default": model.default,
            "schedule_error": model.error,
            "tried": [{"label": g.label, "setting": dict(g.setting), "buckets": len(g.counts),
                       "iteration_ms": g.median_ms} for g in model.tried]},
    }


def write_advice(advice: Advice, priced: FixOrBuy, out: TextIO, details: bool = True) -> None:
    """The advice as a person reads it: the best change and its gain first."""
    w = out.write
    w(advice.headline() + "\n")
    if advice.held:
        w(waste_line(priced) + "\n")
        return
    own = f"; {advice.without_dagtop}" if advice.without_dagtop else ""
    w(f"over {advice.iterations} steady iterations (to {advice.last_iteration}), step {advice.step_ms:.1f} ms "
      f"measured, replayed within {advice.replay_error * 100:.1f} %{own}\n\n")
    rows = candidate_rows(advice)
    if rows:
        widths = [max(len(r[i]) for r in [("change", "ms/step", "range", "throughput", "confidence"), *rows])
                  for i in range(5)]
        head = ("change", "ms/step", "range", "throughput", "confidence")
        for row in (head, *rows):
            w("  " + "  ".join(cell.ljust(widths[i]) if i in (0, 4) else cell.rjust(widths[i])
                                for i, cell in enumerate(row)).rstrip() + "\n")
        w(f"  {CONFIDENCE_KEY}\n")
    if lower_bound_lines(advice):
        w(f"  {lower_bound_key(advice)}\n")
        for line in lower_bound_lines(advice):
            w(f"    at least: {line}\n")
    if advice.little:
        w(f"  {little_line(advice)}\n")
    for c in advice.withheld:
        w(f"  not predicted: {c.title} ({c.kind}): {c.doubt}\n")
    w("\n")
    if priced.now is not None:
        price = f", ${priced.terms.gpu_hour_price:g} per GPU-hour" if priced.terms.gpu_hour_price is not None else ""
        w(f"fix vs buy, per epoch ({priced.epoch.steps if priced.epoch else '?'} steps: "
          f"{priced.epoch.source if priced.epoch else ''}{price})\n")
        rows = cost_rows(priced)
        widths = [max(len(r[i]) for r in [("", "epoch", "GPU-h", "cost", "GPU-h vs now"), *rows]) for i in range(5)]
        for row in (("", "epoch", "GPU-h", "cost", "GPU-h vs now"), *rows):
            w("  " + "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                                for i, cell in enumerate(row)).rstrip() + "\n")
    else:
        w(f"fix vs buy: {priced.unknown}\n")
    w(waste_line(priced) + "\n")
    if not details:
        return
    for n, c in enumerate((*advice.fixes, *advice.buys), 1):
        w(f"\n{n}. {c.title} ({c.kind})\n")
        for line in c.change.splitlines():
            w(f"   {line}\n")
        w(f"   evidence: {c.evidence}\n")
        if c.caveat:
            w(f"   caveat: {c.caveat}\n")
        if c.doubt:
            w(f"   lower confidence: {c.doubt}\n")


def run_advise(args: argparse.Namespace) -> int:
    """The ``advise`` command: 0 on success, 2 when the file cannot be read as a recording."""
    from dagtop.commands.report import open_recording, select

    opened = open_recording("advise", str(args.file), getattr(args, "bandwidth", None))
    if isinstance(opened, int):
        return opened
    pipeline, _ = opened
    chosen = select(pipeline.analyses(), args.iterations)
    if not chosen:
        print("dagtop advise: no analysed iteration in the range asked for", file=sys.stderr)
        return Exit.BAD_INPUT
    advice, priced = advice_of(pipeline.snapshot(), chosen, terms_of(args))
    if args.json:
        json.dump(advice_json(advice, priced), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        write_advice(advice, priced, sys.stdout)
    return Exit.OK
