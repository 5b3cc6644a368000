"""Many iterations' analyses folded into one summary: the report's JSON, also usable by the UI."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from dagtop.model.analysis import model_error, segments_ms
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis, WhatIf
from dagtop.model.verdict import advance
from dagtop.model.whatif import decomposition
from instrument.events import CATEGORIES


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    xs = sorted(values)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(analyses: Sequence[IterationAnalysis]) -> dict[str, Any]:
    """The schema of ``dagtop report --json`` (docs/report.md), over the complete analyses given.

    Incomplete iterations (a rank's events missing) are left out when any complete one exists; stalled iterations
    (:attr:`~dagtop.model.snapshot.IterationAnalysis.stalled`) are left out of the shares, the straggler and the
    what-ifs (they are the report's ``stalls``). The straggler is decided by :func:`dagtop.model.straggler.decide`
    over the iterations kept, and the tie of the bottleneck with the runner-up by the rule of the live verdict
    (:func:`dagtop.model.verdict.advance`, with the whole range as its window).
    """
    complete = [a for a in analyses if a.complete] or list(analyses)
    if not complete:
        return {
            "ranks": 0, "iterations": 0, "lasted_s": 0.0, "iteration_ms": {"median": 0.0, "p90": 0.0},
            "critical_path": {c: (1.0 if c == "other" else 0.0) for c in CATEGORIES}, "bottleneck": "other",
            "tied_with": None, "straggler": None, "predicted_iteration_ms": 0.0, "model_error": 0.0, "what_if": [],
            "exposed_comm_ms": 0.0, "communication_seen": False, "overlap_ratio": 1.0, "incomplete_iterations": 0,
            "stalled_iterations": 0, "decomposition": {}, "interference": [], "network": None,
        }
    stalled = sum(1 for a in complete if a.stalled)
    complete = [a for a in complete if not a.stalled] or complete
    measured = [a.measured_ms for a in complete]
    path_ms = dict.fromkeys(CATEGORIES, 0.0)
    for a in complete:
        for c, ms in segments_ms(a.critical_path).items():
            path_ms[c] = path_ms.get(c, 0.0) + ms
    total = sum(path_ms.values())
    shares = {c: (ms / total if total > 0 else (1.0 if c == "other" else 0.0)) for c, ms in path_ms.items()}
    predicted = statistics.median(a.predicted_ms for a in complete)
    parts = [decomposition(a.critical_path) for a in complete]
    steady = advance(None, complete)
    named = steady.straggler
    straggler = None if named is None else {
        "rank": named.rank, "category": named.category, "excess_ms": named.excess_ms,
        "excess_range_ms": list(named.excess_range_ms), "busy_excess_ms": named.busy_excess_ms,
        "above": named.above, "iterations": named.iterations, "p_value": named.p_value}
    what_if = _what_ifs(complete, named.rank if named is not None else None, predicted)
    network = next((a.network for a in reversed(complete) if a.network is not None), None)
    return {
        "ranks": max(len(a.ranks) for a in complete),
        "iterations": len(complete),
        "lasted_s": sum(measured) / 1000.0,
        "first_iteration": min(a.iteration for a in complete),
        "last_iteration": max(a.iteration for a in complete),
        "iteration_ms": {"median": statistics.median(measured), "p90": _percentile(measured, 0.9)},
        "critical_path": shares,
        "bottleneck": max(CATEGORIES, key=lambda c: shares[c]),
        "tied_with": steady.tied_with,
        "straggler": straggler,
        "predicted_iteration_ms": predicted,
        "model_error": statistics.median(model_error(a) for a in complete),
        "what_if": what_if,
        "exposed_comm_ms": statistics.median(a.exposed_comm_ms for a in complete),
        "communication_seen": any(a.collectives for a in complete),
        "overlap_ratio": statistics.median(a.overlap_ratio for a in complete),
        "incomplete_iterations": sum(1 for a in analyses if not a.complete),
        "stalled_iterations": stalled,
        "decomposition": {term: statistics.median(d[term] for d in parts) for term in parts[0]},
        # The fit as of the last iteration (it grows over the run): compute's slow-down under collectives, per lane.
        "interference": [{"lane": f.lane, "factor": f.factor, "stderr": f.stderr, "applied": f.applied,
                          "samples": f.samples, "blocks": f.blocks} for f in complete[-1].interference],
        # The α-β fit as of the last iteration that had one: what 2N workers and network bandwidth rest on.
        "network": None if network is None else {
            "bus_gbps": _finite(network.bus_gbps), "bus_gbps_range": [_finite(g) for g in network.bus_gbps_range],
            "alpha_us": network.alpha_s * 1e6 if network.alpha_known else None, "beta_s_per_byte": network.beta_s_per_byte,
            "beta_stderr": network.beta_se, "collectives": network.samples, "sizes": network.sizes},
    }


def _finite(x: float) -> float | None:
    """JSON has no infinity: a bandwidth without a per-byte cost (β = 0) is null."""
    return x if math.isfinite(x) else None


def collectives(analyses: Sequence[IterationAnalysis]) -> list[dict[str, Any]]:
    """Each collective by name over the complete analyses, stalled ones out (the report's ``collectives``): its bytes, in how many
    iterations it ran, its median duration (latest ready to end) and its share of the critical path (time-weighted
    as ``critical_path``), the largest share first. A DDP bucket is ``bucket N``; FSDP's are ``all-gather <unit>``,
    ``all-gather <unit> (backward)`` and ``reduce-scatter <unit>`` (instrument/fsdp.py)."""
    complete = [a for a in analyses if a.complete] or list(analyses)
    complete = [a for a in complete if not a.stalled] or complete  # a stall's collectives waited for it
    path_ms = sum(s.duration_ms for a in complete for s in a.critical_path)
    seen: dict[str, dict[str, Any]] = {}
    for a in complete:
        for c in a.collectives:
            row = seen.setdefault(c.name, {"name": c.name, "bytes": c.bytes, "durations": [], "path_ms": 0.0})
            row["durations"].append(c.duration_ms)
        for s in a.critical_path:
            if s.rank is None and s.name in seen:
                seen[s.name]["path_ms"] += s.duration_ms
    rows = [{"name": r["name"], "bytes": r["bytes"], "iterations": len(r["durations"]),
             "median_ms": statistics.median(r["durations"]),
             "critical_path": r["path_ms"] / path_ms if path_ms > 0 else 0.0} for r in seen.values()]
    return sorted(rows, key=lambda r: (-r["critical_path"], -r["median_ms"], r["name"]))


def _what_ifs(analyses: Sequence[IterationAnalysis], straggler: int | None, base: float) -> list[dict[str, Any]]:
    """Each change's speedup, and the iteration time it predicts on ``base`` (the model's median over the steady
    iterations: the same for every change), in the order the changes first appear.

    The speedup is the model's own median over the iterations that replayed the change over their median with it
    (the same iterations on both sides). 'straggler at median' is taken from the iterations that replayed it for the
    report's straggler; a change with bounds from the iterations that have them, so that the point lies within its
    bounds. Those can be a part of the range only (the fit's β not identified yet, the straggler named late), whose
    own median may be another step than the range's (a job that changed speed): read against that, two changes
    would not be comparable, so each is applied to ``base``. A change the last iteration could not predict is
    reported as such, with its reason, and no figure.
    """
    by_change: dict[Change, list[tuple[IterationAnalysis, WhatIf]]] = {}
    for a in analyses:
        for w in a.what_if:
            if w.change is Change.STRAGGLER_AT_MEDIAN and (straggler is None or w.rank != straggler):
                continue
            by_change.setdefault(w.change, []).append((a, w))
    out = []
    for change, seen in by_change.items():
        last = seen[-1][1]
        entry: dict[str, Any] = {"change": change.value, "workers": change.workers}
        if not last.predictable:
            out.append({**entry, "iteration_ms": None, "speedup": None, "throughput": None, "iterations": 0,
                        "unpredictable": last.unpredictable})
            continue
        seen = [(a, w) for a, w in seen if w.predictable]
        if any(w.bounds_ms is not None for _, w in seen):
            seen = [(a, w) for a, w in seen if w.bounds_ms is not None]
        ms = statistics.median(w.iteration_ms for _, w in seen)
        own = statistics.median(a.predicted_ms for a, _ in seen)
        speedup = own / ms if ms > 0 else None
        scale = base / own if own > 0 else 1.0  # the change's figures on the common base
        entry.update({"iteration_ms": ms * scale, "base_ms": base, "speedup": speedup,
                      "throughput": speedup * change.workers if speedup is not None else None,
                      "iterations": len(seen)})
        bounds = [w.bounds_ms for _, w in seen if w.bounds_ms is not None]
        if bounds:
            entry["iteration_ms_bounds"] = [statistics.median(lo for lo, _ in bounds) * scale,
                                            statistics.median(hi for _, hi in bounds) * scale]
        if last.bandwidth_gbps is not None:
            entry["bandwidth_gbps"] = last.bandwidth_gbps  # the last: it follows the fit as the run goes
        if last.rank is not None:
            entry["rank"] = last.rank
        if last.lower_bound:
            entry["lower_bound"] = last.lower_bound
        out.append(entry)
    return out
