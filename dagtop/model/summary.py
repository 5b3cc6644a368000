"""Many iterations' analyses folded into one summary: the report's JSON, also usable by the UI."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dagtop.model.analysis import model_error, segments_ms
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis
from dagtop.model.whatif import decomposition
from instrument.events import CATEGORIES

STRAGGLER_MAJORITY = 0.5
"""A rank is the job's straggler when it was flagged in more than this fraction of the analysed iterations."""


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

    Incomplete iterations (a rank's events missing) are left out when any complete one exists.
    """
    complete = [a for a in analyses if a.complete] or list(analyses)
    if not complete:
        return {
            "ranks": 0, "iterations": 0, "iteration_ms": {"median": 0.0, "p90": 0.0},
            "critical_path": {c: (1.0 if c == "other" else 0.0) for c in CATEGORIES}, "bottleneck": "other",
            "straggler": None, "predicted_iteration_ms": 0.0, "model_error": 0.0, "what_if": [],
            "exposed_comm_ms": 0.0, "communication_seen": False, "overlap_ratio": 1.0, "incomplete_iterations": 0,
            "decomposition": {}, "interference": [], "network": None,
        }
    measured = [a.measured_ms for a in complete]
    path_ms = dict.fromkeys(CATEGORIES, 0.0)
    for a in complete:
        for c, ms in segments_ms(a.critical_path).items():
            path_ms[c] = path_ms.get(c, 0.0) + ms
    total = sum(path_ms.values())
    shares = {c: (ms / total if total > 0 else (1.0 if c == "other" else 0.0)) for c, ms in path_ms.items()}
    predicted = statistics.median(a.predicted_ms for a in complete)
    flagged = [a.straggler for a in complete if a.straggler is not None]
    straggler = None
    if flagged:
        rank, count = Counter(s.rank for s in flagged).most_common(1)[0]
        if count > STRAGGLER_MAJORITY * len(complete):
            mine = [s for s in flagged if s.rank == rank]
            straggler = {
                "rank": rank,
                "category": Counter(s.category for s in mine).most_common(1)[0][0],
                "excess_ms": statistics.median(s.excess_ms for s in mine),
                "busy_excess_ms": statistics.median(s.busy_excess_ms for s in mine),
            }
    changes: dict[Change, list[float]] = {}
    bounds: dict[Change, list[tuple[float, float]]] = {}
    bandwidth: dict[Change, float] = {}
    for a in complete:
        for w in a.what_if:
            if w.change is Change.STRAGGLER_AT_MEDIAN and (
                straggler is None or a.straggler is None or a.straggler.rank != straggler["rank"]
            ):
                continue  # only where the job's straggler was the iteration's
            changes.setdefault(w.change, []).append(w.iteration_ms)
            if w.bounds_ms is not None:
                bounds.setdefault(w.change, []).append(w.bounds_ms)
            if w.bandwidth_gbps is not None:
                bandwidth[w.change] = w.bandwidth_gbps  # the last: it follows the fit as the run goes
    parts = [decomposition(a.critical_path) for a in complete]
    what_if = []
    for change, values in changes.items():
        ms = statistics.median(values)
        speedup = predicted / ms if ms > 0 else None
        entry: dict[str, Any] = {"change": change.value, "iteration_ms": ms, "speedup": speedup, "workers": change.workers,
                 "throughput": speedup * change.workers if speedup is not None else None,
                 "iterations": len(values)}
        if change in bounds:
            entry["iteration_ms_bounds"] = [statistics.median(lo for lo, _ in bounds[change]),
                                            statistics.median(hi for _, hi in bounds[change])]
        if change in bandwidth:
            entry["bandwidth_gbps"] = bandwidth[change]
        what_if.append(entry)
    network = next((a.network for a in reversed(complete) if a.network is not None), None)
    return {
        "ranks": max(len(a.ranks) for a in complete),
        "iterations": len(complete),
        "first_iteration": min(a.iteration for a in complete),
        "last_iteration": max(a.iteration for a in complete),
        "iteration_ms": {"median": statistics.median(measured), "p90": _percentile(measured, 0.9)},
        "critical_path": shares,
        "bottleneck": max(CATEGORIES, key=lambda c: shares[c]),
        "straggler": straggler,
        "predicted_iteration_ms": predicted,
        "model_error": statistics.median(model_error(a) for a in complete),
        "what_if": what_if,
        "exposed_comm_ms": statistics.median(a.exposed_comm_ms for a in complete),
        "communication_seen": any(a.collectives for a in complete),
        "overlap_ratio": statistics.median(a.overlap_ratio for a in complete),
        "incomplete_iterations": sum(1 for a in analyses if not a.complete),
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
    """Each collective by name over the complete analyses (the report's ``collectives``): its bytes, in how many
    iterations it ran, its median duration (latest ready to end) and its share of the critical path (time-weighted
    as ``critical_path``), the largest share first. A DDP bucket is ``bucket N``; FSDP's are ``all-gather <unit>``,
    ``all-gather <unit> (backward)`` and ``reduce-scatter <unit>`` (instrument/fsdp.py)."""
    complete = [a for a in analyses if a.complete] or list(analyses)
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
