"""Replay of the contracted DAG under changed durations, and the critical path with its per-task detail."""

from __future__ import annotations

import numpy as np

from dagtop.model.dag import CATEGORIES, COLLECTIVE, F64, ORIGIN, IterationDag
from dagtop.model.snapshot import Segment

GAP_NAME = "untimed host work"
"""Host time between timed tasks (Python overhead, loss, zero_grad, launch): 'other' on the path."""


def durations(dag: IterationDag, scale: F64) -> F64:
    """Node durations (ns) for each scenario.

    Args:
        scale: (scenarios, ranks + 1, categories) multipliers of the busy time; row ``len(ranks)`` scales the
            collectives. Untimed host gaps inside a node are never scaled.

    Returns:
        (scenarios, nodes) durations.
    """
    rank_row = np.searchsorted(np.array(dag.ranks + (1 << 30,)), dag.rank_of)
    rank_row[dag.kind == COLLECTIVE] = len(dag.ranks)
    return dag.internal[None, :] + np.einsum("nc,snc->sn", dag.catsum, scale[:, rank_row, :])


def replay(dag: IterationDag, dur: F64) -> tuple[F64, F64]:
    """Schedule every node as early as its predecessors allow, keeping the observed gaps; (start, end) per scenario.

    Origins keep their observed times. The identity scenario reproduces the observed schedule wherever the
    observation is consistent with the DAG.
    """
    scenarios = dur.shape[0]
    start = np.empty((scenarios, dag.nodes))
    origins = dag.kind == ORIGIN
    start[:, origins] = dag.a[origins]
    end = start + dur
    end[:, origins] = start[:, origins]
    for nodes, src, offsets, lat in dag.levels:
        ready = np.maximum.reduceat(end[:, src] + lat, offsets, axis=1)
        s = ready + dag.gap[nodes]
        start[:, nodes] = s
        end[:, nodes] = s + dur[:, nodes]
    return start, end


def critical_nodes(dag: IterationDag, end: F64) -> list[tuple[int, int]]:
    """Nodes of the longest path, last first, each with the edge that bound it (-1 for the final node)."""
    v = int(np.argmax(end))
    path: list[tuple[int, int]] = []
    via = -1
    while dag.kind[v] != ORIGIN:
        path.append((v, via))
        lo, hi = int(dag.dst_ptr[v]), int(dag.dst_ptr[v + 1])
        if lo == hi:
            break
        e = lo + int(np.argmax(end[dag.src[lo:hi]] + dag.lat[lo:hi]))
        via, v = e, int(dag.src[e])
    path.append((v, via))
    return path


def critical_segments(dag: IterationDag, start: F64, end: F64, origin_ns: int) -> tuple[Segment, ...]:
    """The critical path of the identity replay as time-ordered segments tiling [origin_ns, iteration end].

    Each contracted node on the path is expanded into its tasks (a task split by a bucket-ready point
    contributes only the part before it) and the untimed gaps between them.
    """
    path = critical_nodes(dag, end)
    out: list[Segment] = []
    cursor = float(end[path[0][0]])
    for v, via in path:
        kind = dag.kind[v]
        if kind == ORIGIN:
            break
        r = int(dag.rank_of[v])
        s, e = float(start[v]), min(float(end[v]), cursor)
        if kind == COLLECTIVE:
            c = next(c for c in dag.collectives if c.node == v)
            _push(out, None, "allreduce", "allreduce", c.name, s, e)
        else:
            _expand_run(out, dag, v, s, e)
        # The stretch between the binding predecessor's end (plus latency) and this node's start: host gap.
        lo, hi = int(dag.dst_ptr[v]), int(dag.dst_ptr[v + 1])
        if lo < hi:
            j = lo + int(np.argmax(end[dag.src[lo:hi]] + dag.lat[lo:hi]))
            pred_end = float(end[dag.src[j]] + dag.lat[j])
        else:
            pred_end = s
        _push(out, r if kind != COLLECTIVE else None, "other", "gap", GAP_NAME, pred_end, s)
        cursor = min(pred_end, s)
    out.reverse()
    return tuple(_clip(out, float(origin_ns)))


def _expand_run(out: list[Segment], dag: IterationDag, v: int, s: float, e: float) -> None:
    """Append (in reverse time order) the tasks and gaps of run node ``v`` replayed over [s, e]."""
    lane = dag.lanes[int(dag.lane_of[v])]
    a0, b0 = int(dag.a[v]), int(dag.b[v])
    shift = s - a0  # identity replay: 0 where the observation is consistent; else the schedule slid
    j0 = max(int(np.searchsorted(lane.start, a0, side="right")) - 1, 0)
    j1 = int(np.searchsorted(lane.start, b0, side="left"))
    pieces: list[tuple[float, float, int]] = []
    for j in range(j0, max(j1, j0 + 1)):
        if j >= len(lane.events):
            break
        ts, te = max(int(lane.start[j]), a0), min(int(lane.end[j]), b0)
        if te > ts:
            pieces.append((ts + shift, te + shift, j))
    t = min(b0 + shift, e)
    for ts, te, j in reversed(pieces):
        te = min(te, e)
        if te < t:
            _push(out, lane.rank, "other", "gap", GAP_NAME, te, t)
        ev = lane.events[j]
        _push(out, lane.rank, ev.category, ev.phase, ev.name, min(ts, te), te)
        t = min(ts, te)
    if s < t:
        _push(out, lane.rank, "other", "gap", GAP_NAME, s, t)


def _push(out: list[Segment], rank: int | None, category: str, phase: str, name: str, s: float, e: float) -> None:
    if e > s:
        out.append(Segment(rank, category, phase, name, int(round(s)), int(round(e))))


def _clip(segments: list[Segment], origin: float) -> list[Segment]:
    o = int(round(origin))
    out = []
    for seg in segments:
        if seg.end_ns <= o:
            continue
        if seg.start_ns < o:
            seg = Segment(seg.rank, seg.category, seg.phase, seg.name, o, seg.end_ns)
        out.append(seg)
    return out


def shares(segments: tuple[Segment, ...]) -> dict[str, float]:
    """Category → fraction of the path's length; sums to 1 (all 'other' for an empty path)."""
    total = {c: 0 for c in CATEGORIES}
    for seg in segments:
        total[seg.category] = total.get(seg.category, 0) + (seg.end_ns - seg.start_ns)
    length = sum(total.values())
    if length <= 0:
        return {c: (1.0 if c == "other" else 0.0) for c in CATEGORIES}
    return {c: t / length for c, t in total.items()}
