"""The advice and its price in words: the rows, lines and units that ``dagtop advise``, ``dagtop report``, the
advice screen and the Prometheus gauges share, so that each says the same thing the same way."""

from __future__ import annotations

from collections.abc import Sequence

from dagtop.model.advice import MIN_GAIN, Advice, Confidence, advise
from dagtop.model.cost import CostTerms, EpochCost, FixOrBuy, fix_or_buy
from dagtop.model.snapshot import IterationAnalysis, Snapshot
from dagtop.model.trust import RECORD


def terms_of(options: object) -> CostTerms:
    """The cost options of any command that has them (its parsed arguments; absent ones are None)."""
    return CostTerms(getattr(options, "gpu_hour_price", None), getattr(options, "epoch_samples", None),
                     getattr(options, "batch_size", None))


def advice_of(snap: Snapshot, analyses: Sequence[IterationAnalysis], terms: CostTerms) -> tuple[Advice, FixOrBuy]:
    """The advice over ``analyses`` (a snapshot's, or a report's range), priced."""
    advice = advise(analyses, snap.ranks, snap.buckets, snap.telemetry, snap.thread_cpu)
    return advice, fix_or_buy(advice, analyses, snap.ranks, terms)


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


AT_MOST = "≤"
"""Before a step time, an epoch's time or cost that is an upper bound (its change's gain is a lower one, ``≥``)."""


def candidate_rows(advice: Advice) -> list[tuple[str, str, str, str, str]]:
    """(change, step ms, range, throughput, confidence) for each predicted candidate, fixes then buys; a lower bound
    on the gain reads ``≥+23 %`` and its step ``≤80.0`` (the range is its replay's)."""
    rows = []
    for c in (*advice.fixes, *advice.buys):
        if c.step_ms is None:
            continue
        span = f"{c.range_ms[0]:.1f}–{c.range_ms[1]:.1f}" if c.range_ms else ""
        gain = c.gain + (f" ({(c.efficiency or 0) * 100:.0f} % eff.)" if c.workers > 1 else "")
        mark = "" if c.confidence is Confidence.VALIDATED else "?"
        rows.append((c.title, f"{AT_MOST if c.lower_bound else ''}{c.step_ms:.1f}", span, gain,
                     f"{c.confidence}{mark}"))
    return rows


CONFIDENCE_KEY = (f"validated: re-runs of that change on jobs like this one all met the target ({RECORD}); lower?: "
                  "the reason is under the change")
"""What the confidence column says."""


def lower_bound_lines(advice: Advice) -> list[str]:
    """Each predicted change whose gain is a lower bound (``≥``, its step and cost ``≤``), with why."""
    return [f"{c.title}: {c.lower_bound}" for c in (*advice.fixes, *advice.buys, *advice.little) if c.lower_bound]


def lower_bound_key(advice: Advice) -> str:
    """What ``≥`` and ``≤`` mean, where any change has them; empty where none has."""
    return ("≥ ≤: a lower bound on the gain, an upper one on the step, the epoch and its cost"
            if lower_bound_lines(advice) else "")


def cost_rows(priced: FixOrBuy) -> list[tuple[str, str, str, str, str]]:
    """(change, epoch, GPU-hours, cost, GPU-hours against now) per priced row, ``now`` first."""
    if priced.now is None:
        return []
    price = priced.terms.gpu_hour_price
    out = [("now", hours(priced.now.hours), gpu_time(priced.now.gpu_hours), _money(priced.now, price), "")]
    for c, e in priced.rows:
        most = AT_MOST if e.at_most else ""
        money = _money(e, price)
        out.append((c.title, most + hours(e.hours), most + gpu_time(e.gpu_hours), most + money if money != "—" else money,
                    f"{most}×{e.gpu_hours / priced.now.gpu_hours:.2f}" if priced.now.gpu_hours else ""))
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
    price = priced.terms.gpu_hour_price

    def share(x: float) -> str:
        return f"{x / w.gpu_hours * 100:.0f} %" if w.gpu_hours else "—"

    def dollars(x: float) -> str:
        return f", ${x * price:,.2f}" if price is not None else ""

    least = "≥" if w.straggler_lower_bound and w.straggler > 0 else ""  # its replay is a lower bound: the loss too
    return (f"waste so far ({w.iterations} iterations, {gpu_time(w.gpu_hours)}{dollars(w.gpu_hours)}): exposed "
            f"communication {gpu_time(w.communication)} ({share(w.communication)}), loading {gpu_time(w.loading)} "
            f"({share(w.loading)}), straggler {least}{gpu_time(w.straggler)} ({least}{share(w.straggler)}); each "
            "alone: they overlap")
