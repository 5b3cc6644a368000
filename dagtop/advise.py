"""``dagtop advise``: what to change in a recorded job and what it is worth, as text or JSON (docs/report.md).

The same advice is a section of ``dagtop report``, a screen of the live monitor (``a``) and Prometheus gauges; this
module words it for all of them: :func:`advice_json` the JSON, :func:`write_advice` the text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from dagtop.exits import Exit
from dagtop.model.advice import MIN_GAIN, Advice, Candidate, Confidence, advise
from dagtop.model.cost import CostTerms, EpochCost, FixOrBuy, fix_or_buy
from dagtop.model.snapshot import IterationAnalysis, Snapshot


def terms_of(args: argparse.Namespace) -> CostTerms:
    """The cost options of any command that has them (absent ones are None)."""
    return CostTerms(getattr(args, "gpu_hour_price", None), getattr(args, "epoch_samples", None),
                     getattr(args, "batch_size", None))


def advice_of(snap: Snapshot, analyses: Sequence[IterationAnalysis], terms: CostTerms) -> tuple[Advice, FixOrBuy]:
    """The advice over ``analyses`` (a snapshot's, or a report's range), priced."""
    advice = advise(analyses, snap.ranks, snap.buckets, snap.telemetry)
    return advice, fix_or_buy(advice, analyses, snap.ranks, terms)


def _cost(e: EpochCost | None) -> dict[str, Any] | None:
    return None if e is None else {"hours": e.hours, "gpu_hours": e.gpu_hours, "dollars": e.dollars}


def _candidate(c: Candidate, epoch: EpochCost | None) -> dict[str, Any]:
    return {"kind": str(c.kind), "title": c.title, "change": c.change, "setting": dict(c.setting),
            "step_ms": c.step_ms, "step_ms_range": list(c.range_ms) if c.range_ms else None, "speedup": c.speedup,
            "throughput": c.throughput, "workers": c.workers, "samples": c.samples, "efficiency": c.efficiency,
            "confidence": str(c.confidence), "doubt": c.doubt, "caveat": c.caveat, "evidence": c.evidence,
            "epoch": _cost(epoch)}


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
                  "loading": w.loading, "straggler": w.straggler},
        "buckets": None if model is None else {
            "now_bytes": _bytes(model.layout.sizes, model.layout.now), "default": model.default,
            "schedule_error": model.error,
            "tried": [{"label": g.label, "setting": dict(g.setting), "buckets": len(g.counts),
                       "iteration_ms": g.median_ms} for g in model.tried]},
    }


def _bytes(sizes: Sequence[int], counts: Sequence[int]) -> list[int]:
    out, at = [], 0
    for n in counts:
        out.append(sum(sizes[at:at + n]))
        at += n
    return out


def _money(e: EpochCost, price: float | None) -> str:
    return f"${e.dollars:,.2f}" if e.dollars is not None and price is not None else "—"


def hours(h: float) -> str:
    """An epoch's length as a person says it: ``42 s``, ``3.5 min``, ``2.1 h``, ``3.2 days``."""
    s = h * 3600
    if s < 90:
        return f"{s:.0f} s"
    if h < 1.5:
        return f"{s / 60:.1f} min"
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def candidate_rows(advice: Advice) -> list[tuple[str, str, str, str, str]]:
    """(change, step ms, range, throughput, confidence) for each predicted candidate, fixes then buys."""
    rows = []
    for c in (*advice.fixes, *advice.buys):
        if c.step_ms is None:
            continue
        span = f"{c.range_ms[0]:.1f}–{c.range_ms[1]:.1f}" if c.range_ms else ""
        gain = c.gain + (f" ({(c.efficiency or 0) * 100:.0f} % eff.)" if c.workers > 1 else "")
        mark = "" if c.confidence is Confidence.VALIDATED else "?"
        rows.append((c.title, f"{c.step_ms:.1f}", span, gain, f"{c.confidence}{mark}"))
    return rows


def cost_rows(priced: FixOrBuy) -> list[tuple[str, str, str, str, str]]:
    """(change, epoch, GPU-hours, cost, GPU-hours against now) per priced row, ``now`` first."""
    if priced.now is None:
        return []
    price = priced.terms.gpu_hour_price
    out = [("now", hours(priced.now.hours), gpu_time(priced.now.gpu_hours), _money(priced.now, price), "")]
    for c, e in priced.rows:
        out.append((c.title, hours(e.hours), gpu_time(e.gpu_hours), _money(e, price),
                    f"×{e.gpu_hours / priced.now.gpu_hours:.2f}" if priced.now.gpu_hours else ""))
    return out


def gpu_time(h: float) -> str:
    """GPU-hours in the unit that reads best: ``40 GPU-s``, ``3.2 GPU-min``, ``1.25 GPU-h``."""
    if h * 3600 < 90:
        return f"{h * 3600:.3g} GPU-s"
    return f"{h * 60:.3g} GPU-min" if h < 1.5 else f"{h:.3g} GPU-h"


def little_line(advice: Advice) -> str:
    """The fixes considered and not advised: each predicted to gain under 2 %."""
    return (f"under {MIN_GAIN * 100:.0f} %, not advised: "
            + ", ".join(f"{c.title} {c.gain}" for c in advice.little))


def waste_line(priced: FixOrBuy) -> str:
    """GPU-hours lost so far, by cause (each alone: they overlap)."""
    w = priced.waste
    if not w.iterations:
        return "waste: no steady iteration yet"
    share = (lambda x: f"{x / w.gpu_hours * 100:.0f} %") if w.gpu_hours else (lambda x: "—")
    price = priced.terms.gpu_hour_price
    dollars = (lambda x: f", ${x * price:,.2f}") if price is not None else (lambda x: "")
    return (f"waste so far ({w.iterations} iterations, {gpu_time(w.gpu_hours)}{dollars(w.gpu_hours)}): exposed "
            f"communication {gpu_time(w.communication)} ({share(w.communication)}), loading {gpu_time(w.loading)} "
            f"({share(w.loading)}), straggler {gpu_time(w.straggler)} ({share(w.straggler)}); each alone: they "
            "overlap")


def write_advice(advice: Advice, priced: FixOrBuy, out: TextIO, details: bool = True) -> None:
    """The advice as a person reads it: the best change and its gain first."""
    w = out.write
    w(advice.headline() + "\n")
    if advice.held:
        w(waste_line(priced) + "\n")
        return
    w(f"over {advice.iterations} steady iterations (to {advice.last_iteration}), step {advice.step_ms:.1f} ms "
      f"measured, replayed within {advice.replay_error * 100:.1f} %\n\n")
    rows = candidate_rows(advice)
    if rows:
        widths = [max(len(r[i]) for r in [("change", "ms/step", "range", "throughput", "confidence"), *rows])
                  for i in range(5)]
        head = ("change", "ms/step", "range", "throughput", "confidence")
        for row in (head, *rows):
            w("  " + "  ".join(cell.ljust(widths[i]) if i in (0, 4) else cell.rjust(widths[i])
                                for i, cell in enumerate(row)).rstrip() + "\n")
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
    from dagtop.report import open_recording, select

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
