"""Replay of the contracted DAG under changed durations, and the critical path with its per-task detail."""

from __future__ import annotations

from functools import partial

import numpy as np

from dagtop.model.dag import COLLECTIVE, ORIGIN, IterationDag
from dagtop.model.snapshot import Segment
from dagtop.model.table import F64
from dagtop.model.tasks import CATEGORY_NAMES, PHASE_NAMES
from instrument.events import CATEGORIES

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
    dur: F64 = dag.internal[None, :] + np.einsum("nc,snc->sn", dag.catsum, scale[:, rank_row, :])
    return dur


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


CriticalNodes = list[tuple[int, int]]
"""The longest path as (node, the edge into it that bound it), last node first, down to an origin (edge -1)."""


def critical_nodes(dag: IterationDag, end: F64) -> CriticalNodes:
    """The longest path of a replay ending at ``end``: walked once, back from the node that ends last, each
    step along the predecessor edge that set the node's start (the first such edge on a tie)."""
    v = int(np.argmax(end))
    path: CriticalNodes = []
    while dag.kind[v] != ORIGIN:
        lo, hi = int(dag.dst_ptr[v]), int(dag.dst_ptr[v + 1])
        if lo == hi:  # no predecessor: only an origin starts a path in a well-formed DAG
            path.append((v, -1))
            return path
        e = lo + int(np.argmax(end[dag.src[lo:hi]] + dag.lat[lo:hi]))
        path.append((v, e))
        v = int(dag.src[e])
    path.append((v, -1))
    return path


def critical_segments(dag: IterationDag, path: CriticalNodes, start: F64, end: F64, origin_ns: int
                      ) -> tuple[Segment, ...]:
    """The critical path of the identity replay as time-ordered segments tiling [origin_ns, iteration end].

    Each contracted node on the path is expanded into its tasks (a task split by a bucket-ready point
    contributes only the part before it) and the untimed gaps between them.

    Args:
        path: :func:`critical_nodes` of this replay.
    """
    rows: list[_Row] = []  # in reverse time order
    cursor = float(end[path[0][0]])
    for v, into in path:
        kind = dag.kind[v]
        if kind == ORIGIN:
            break
        r = int(dag.rank_of[v])
        s, e = float(start[v]), min(float(end[v]), cursor)
        if kind == COLLECTIVE:
            c = next(c for c in dag.collectives if c.node == v)
            _push(rows, None, "allreduce", "allreduce", c.name, s, e)
        else:
            _expand_run(rows, dag, v, s, e)
        # The stretch between the binding predecessor's end (plus latency) and this node's start: host gap.
        pred_end = float(end[dag.src[into]] + dag.lat[into]) if into >= 0 else s
        _push(rows, r if kind != COLLECTIVE else None, "other", "gap", GAP_NAME, pred_end, s)
        cursor = min(pred_end, s)
    rows.reverse()
    o = int(origin_ns)
    return tuple(_make_segment(row if row[4] >= o else (*row[:4], o, row[5])) for row in rows if row[5] > o)


_Row = tuple[int | None, str, str, str, int, int]
_make_segment = partial(tuple.__new__, Segment)


def _expand_run(rows: list[_Row], dag: IterationDag, v: int, s: float, e: float) -> None:
    """Append (in reverse time order) the tasks and gaps of run node ``v`` replayed over [s, e]."""
    t = dag.table
    lane = int(dag.lane_of[v])
    lo, hi = int(t.lane_lo[lane]), int(t.lane_hi[lane])
    rank = dag.ranks[int(t.lane_rank[lane])]
    starts, ends = t.start[lo:hi], t.end[lo:hi]
    a0, b0 = int(dag.a[v]), int(dag.b[v])
    shift = s - a0  # identity replay: 0 where the observation is consistent; else the schedule slid
    j0 = max(int(np.searchsorted(starts, a0, side="right")) - 1, 0)
    j1 = min(max(int(np.searchsorted(starts, b0, side="left")), j0 + 1), hi - lo)
    ts = np.maximum(starts[j0:j1], a0)
    te = np.minimum(ends[j0:j1], b0)
    keep = np.flatnonzero(te > ts)[::-1]  # latest first
    ts = ts[keep] + shift
    te = np.minimum(te[keep] + shift, e)
    seg_start = np.minimum(ts, te)
    # Walking back from the end: before each task, the gap up to where the next task began.
    cursor = np.concatenate(([min(b0 + shift, e)], seg_start))
    gap_start, gap_end = te, cursor[:-1]
    # Interleave: gap after task k (in time), then task k; then the gap in front of the first task.
    begin = np.empty(2 * len(keep) + 1)
    finish = np.empty(2 * len(keep) + 1)
    begin[0:-1:2], finish[0:-1:2] = gap_start, gap_end
    begin[1:-1:2], finish[1:-1:2] = seg_start, te
    begin[-1], finish[-1] = s, cursor[-1]
    shown = np.flatnonzero(finish > begin)
    events = keep + lo + j0
    is_task = shown % 2 == 1
    task = events[shown[is_task] // 2]
    names = t.source[int(t.rank_idx[lo])].name
    category = np.full(len(shown), "other", dtype=object)
    phase = np.full(len(shown), "gap", dtype=object)
    name = np.full(len(shown), GAP_NAME, dtype=object)
    category[is_task] = CATEGORY_NAMES[t.cat[task]]
    phase[is_task] = PHASE_NAMES[t.phase[task]]
    name[is_task] = [names[i] for i in t.src[task].tolist()]
    rows.extend(zip([rank] * len(shown), category.tolist(), phase.tolist(), name.tolist(),
                    np.rint(begin[shown]).astype(np.int64).tolist(), np.rint(finish[shown]).astype(np.int64).tolist()))


def _push(rows: list[_Row], rank: int | None, category: str, phase: str, name: str, s: float, e: float) -> None:
    if e > s:
        rows.append((rank, category, phase, name, round(s), round(e)))


def shares(segments: tuple[Segment, ...]) -> dict[str, float]:
    """Category → fraction of the path's length; sums to 1 (all 'other' for an empty path)."""
    total = {c: 0 for c in CATEGORIES}
    for seg in segments:
        total[seg.category] = total.get(seg.category, 0) + (seg.end_ns - seg.start_ns)
    length = sum(total.values())
    if length <= 0:
        return {c: (1.0 if c == "other" else 0.0) for c in CATEGORIES}
    return {c: t / length for c, t in total.items()}
