"""``dagtop export``: a recording as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Layout: a process per rank (``rank N``) with a thread per lane (``main``, ``gpu``, ``copy``, ``comm``; a lane whose
tasks overlap, as gloo's concurrent collectives do, is split over ``comm``, ``comm 2``, … so that every track's
slices nest); each collective linked across its ranks by flow arrows from the rank it waited for; one more process,
``critical path``, with a slice per iteration (its measured and predicted time, bottleneck, straggler and
what-ifs as arguments) above the path's segments. The report's summary, what-ifs included, is the file's
``metadata``. Times are microseconds from the earliest task on the common clock.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagtop.exits import Exit
from dagtop.io.folded import load
from dagtop.io.output import OutputError, whole_file
from dagtop.io.recording import RecordingError
from dagtop.model.snapshot import IterationAnalysis
from dagtop.model.summary import summarize

LANE_ORDER = ("main", "gpu", "copy", "comm")
FLOW_CATEGORY = "collective"


def _us(ns: int, zero: int) -> float:
    return round((ns - zero) / 1e3, 3)


class _Tracks:
    """Thread ids per (rank, lane), a lane split into sub-tracks where its tasks overlap."""

    def __init__(self) -> None:
        self.ends: dict[tuple[int, str], list[int]] = {}
        self.names: dict[tuple[int, int], str] = {}

    def place(self, rank: int, lane: str, start: int, end: int) -> int:
        ends = self.ends.setdefault((rank, lane), [])
        for i, last in enumerate(ends):
            if last <= start:
                ends[i] = end
                break
        else:
            ends.append(end)
            i = len(ends) - 1
        tid = (LANE_ORDER.index(lane) if lane in LANE_ORDER else len(LANE_ORDER)) * 100 + i + 1
        self.names[(rank, tid)] = lane if i == 0 else f"{lane} {i + 1}"
        return tid


def _what_if(a: IterationAnalysis) -> list[dict[str, Any]]:
    return [{"change": str(w.change), "iteration_ms": round(w.iteration_ms, 3), "speedup": round(w.speedup, 4)}
            if w.predictable else {"change": str(w.change), "unpredictable": w.unpredictable} for w in a.what_if]


def chrome_trace(analyses: Sequence[IterationAnalysis], summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace-event JSON object of these analyses (oldest first)."""
    events: list[dict[str, Any]] = []
    if not analyses:
        return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"dagtop": summary or {}}}
    zero = min(min(a.origin_ns for a in analyses), min((t.start_ns for a in analyses for t in a.tasks), default=0))
    ranks = sorted({r for a in analyses for r in a.ranks})
    path_pid = max(ranks) + 2
    tracks = _Tracks()
    flow_id = 0
    # Tasks sorted by start so that each sub-track is filled in time order.
    for a in analyses:
        slices: dict[tuple[int, str], dict[str, Any]] = {}
        for t in sorted(a.tasks, key=lambda t: (t.start_ns, -t.end_ns)):
            tid = tracks.place(t.rank, t.lane, t.start_ns, t.end_ns)
            ev = {"ph": "X", "name": t.name, "cat": t.category, "pid": t.rank + 1, "tid": tid,
                  "ts": _us(t.start_ns, zero), "dur": round((t.end_ns - t.start_ns) / 1e3, 3),
                  "args": {"phase": t.phase, "iteration": a.iteration, **({"bytes": t.bytes} if t.bytes else {})}}
            events.append(ev)
            if t.lane == "comm":
                slices[(t.rank, t.name)] = ev
        for c in a.collectives:
            source = slices.get((c.gating_rank, c.name))
            if source is None:
                continue
            for rank in sorted(c.ready_ns):
                target = slices.get((rank, c.name))
                if rank == c.gating_rank or target is None:
                    continue
                flow_id += 1
                common = {"name": c.name, "cat": FLOW_CATEGORY, "id": flow_id}
                ts = max(source["ts"], min(target["ts"] + target["dur"], source["ts"] + source["dur"]))
                events.append({**common, "ph": "s", "pid": source["pid"], "tid": source["tid"], "ts": source["ts"]})
                events.append({**common, "ph": "f", "bp": "e", "pid": target["pid"], "tid": target["tid"],
                               "ts": max(ts, target["ts"])})
        events.extend(_critical_path(a, zero, path_pid))
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank + 1, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank + 1, "tid": 0, "args": {"sort_index": rank}})
    for (rank, tid), name in sorted(tracks.names.items()):
        events.append({"ph": "M", "name": "thread_name", "pid": rank + 1, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank + 1, "tid": tid, "args": {"sort_index": tid}})
    events.append({"ph": "M", "name": "process_name", "pid": path_pid, "tid": 0, "args": {"name": "critical path"}})
    events.append({"ph": "M", "name": "process_sort_index", "pid": path_pid, "tid": 0, "args": {"sort_index": -1}})
    events.append({"ph": "M", "name": "thread_name", "pid": path_pid, "tid": 1, "args": {"name": "critical path"}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"dagtop": summary or {}}}


def _critical_path(a: IterationAnalysis, zero: int, pid: int) -> list[dict[str, Any]]:
    """The iteration's slice on the critical-path track, its segments nested under it."""
    if not a.critical_path:
        return []
    start = min(s.start_ns for s in a.critical_path)
    end = max(s.end_ns for s in a.critical_path)
    straggler = a.straggler
    out = [{"ph": "X", "name": f"iteration {a.iteration}", "cat": "iteration", "pid": pid, "tid": 1,
            "ts": _us(start, zero), "dur": round((end - start) / 1e3, 3),
            "args": {"measured_ms": round(a.measured_ms, 3), "predicted_ms": round(a.predicted_ms, 3),
                     "bottleneck": a.bottleneck, "complete": a.complete,
                     "shares": {c: round(v, 4) for c, v in a.shares.items()},
                     "exposed_comm_ms": round(a.exposed_comm_ms, 3),
                     "straggler": None if straggler is None else
                     {"rank": straggler.rank, "category": straggler.category,
                      "excess_ms": round(straggler.excess_ms, 3)},
                     "what_if": _what_if(a)}}]
    last = start
    for s in sorted(a.critical_path, key=lambda s: s.start_ns):
        begin = max(s.start_ns, last)  # segments follow each other: clip a rounding overlap so they nest
        if s.end_ns <= begin:
            continue
        where = "all ranks" if s.rank is None else f"rank {s.rank}"
        out.append({"ph": "X", "name": f"{s.name} ({where})", "cat": s.category, "pid": pid, "tid": 1,
                    "ts": _us(begin, zero), "dur": round((s.end_ns - begin) / 1e3, 3),
                    "args": {"rank": s.rank, "phase": s.phase, "category": s.category}})
        last = s.end_ns
    return out


def run_export(args: argparse.Namespace) -> int:
    """The ``dagtop export`` command: 0 on success, 2 when the file cannot be read as a recording, 4 when the
    trace cannot be written (nothing of it is left)."""
    path = str(args.file)
    if not Path(path).is_file():
        what = "is a directory, not a recording" if Path(path).is_dir() else "no such file"
        print(f"dagtop export: {path}: {what}", file=sys.stderr)
        return Exit.BAD_INPUT
    try:
        pipeline, truncated = load(path)
    except (RecordingError, OSError) as exc:
        print(f"dagtop export: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    analyses = pipeline.analyses()
    if not analyses:
        print(f"dagtop export: {path} holds no iteration of any rank", file=sys.stderr)
        return Exit.BAD_INPUT
    if truncated:
        print(f"dagtop export: warning: {path} ends in a cut-short record; exporting the complete frames before it",
              file=sys.stderr)
    summary = summarize([a for a in analyses if a.iteration >= 1] or analyses)
    trace = chrome_trace(analyses, summary)
    try:
        with whole_file(args.output) as out, open(out, "w") as f:
            json.dump(trace, f, separators=(",", ":"))
    except OutputError as exc:
        print(f"dagtop export: {exc}", file=sys.stderr)
        return Exit.DISK
    print(f"dagtop export: {len(analyses)} iterations, {len(trace['traceEvents'])} events → {args.output}",
          file=sys.stderr)
    return Exit.OK
