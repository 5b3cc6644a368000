"""The cross-rank DAG of one iteration, with each rank's lane chains contracted between synchronisation points.

A node per task would cost ~1 µs per task in networkx; instead each lane of each rank is cut only where
something crosses it (a bucket becoming ready, the update waiting for the collectives, a copy feeding the
compute lane) and every stretch between two cuts becomes one node carrying its busy time per category
and its untimed host gaps. The graph then has O(ranks × buckets) nodes, held in flat numpy arrays; the
per-task detail stays in the :class:`LaneTrace` and is expanded only where the critical path needs it.

Edges are precedence with a fixed latency: a node starts at ``max(pred end + latency) + gap`` where
``gap`` is the untimed host time observed in front of it. Collectives are single nodes fed by every
rank's bucket-ready point; they start at the latest ready time, after the previous collective on the
comm channel unless the observation shows them running concurrently.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import numpy.typing as npt

from instrument.wire import Event

CATEGORIES: tuple[str, ...] = ("compute", "io", "pcie", "allreduce", "other")
CATEGORY_INDEX: dict[str, int] = {c: i for i, c in enumerate(CATEGORIES)}
ALLREDUCE = CATEGORY_INDEX["allreduce"]

_LANE = operator.itemgetter(3)

ORIGIN, RUN, COLLECTIVE = 0, 1, 2
"""Node kinds: a rank's fixed start, a contracted stretch of one lane, a collective across ranks."""

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class LaneTrace:
    """The tasks of one lane of one rank, in program order, on the common clock."""

    __slots__ = ("rank", "lane", "events", "phases", "start", "end", "cat", "cum")

    def __init__(self, rank: int, lane: str, events: list[Event], offset_ns: int) -> None:
        cats, phases, _, _, starts, ends, _ = zip(*events)
        start = np.array(starts, dtype=np.int64)
        end = np.array(ends, dtype=np.int64)
        if len(start) > 1 and bool((start[1:] < start[:-1]).any()):
            order = np.argsort(start, kind="stable")
            events = [events[i] for i in order.tolist()]
            cats = tuple(cats[i] for i in order.tolist())
            phases = tuple(phases[i] for i in order.tolist())
            start, end = start[order], end[order]
        self.rank, self.lane, self.events, self.phases = rank, lane, events, phases
        self.start: I64 = start + offset_ns
        self.end: I64 = np.maximum(end + offset_ns, self.start)
        self.cat = np.fromiter(map(CATEGORY_INDEX.__getitem__, cats), dtype=np.intp, count=len(cats))
        per_task = np.zeros((len(events), len(CATEGORIES)))
        per_task[np.arange(len(events)), self.cat] = self.end - self.start
        self.cum: F64 = np.zeros((len(events) + 1, len(CATEGORIES)))
        np.cumsum(per_task, axis=0, out=self.cum[1:])

    def busy(self, times: I64) -> F64:
        """Busy time per category on this lane before each of ``times`` (rows: times, columns: categories)."""
        j = np.searchsorted(self.start, times, side="right") - 1
        jc = np.maximum(j, 0)
        out = self.cum[jc]
        part = np.clip(times - self.start[jc], 0, self.end[jc] - self.start[jc]).astype(np.float64)
        part[j < 0] = 0.0
        out[np.arange(len(times)), self.cat[jc]] += part
        return out


@dataclass(slots=True)
class CollectiveObs:
    """One bucket's all-reduce as every rank saw it."""

    name: str
    bytes: int
    ready: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    marker: dict[int, int] = field(default_factory=dict)
    """Rank → the node that ends at that rank's bucket-ready point."""
    node: int = -1
    start_ns: int = 0
    end_ns: int = 0


@dataclass(slots=True)
class IterationDag:
    """The contracted DAG of one iteration. Arrays are indexed by node; edges are sorted by destination."""

    ranks: tuple[int, ...]
    lanes: list[LaneTrace]
    comm: dict[int, list[Event]]
    collectives: list[CollectiveObs]
    offsets: dict[int, int]
    """Rank → ns added to its clock to reach the common clock."""
    origin: dict[int, int]
    """Rank → when its iteration began: its previous update end, else its first task start."""
    kind: I64
    rank_of: I64
    """Node → rank; collectives carry ``len(ranks)``, the row of the scale matrix that is not a rank."""
    lane_of: I64
    """Node → index into ``lanes`` (-1 for origins and collectives)."""
    a: I64
    b: I64
    catsum: F64
    """Busy ns per category inside the node."""
    internal: F64
    """Untimed host ns inside the node: fixed under every change."""
    gap: F64
    """Untimed host ns in front of the node, after its latest predecessor: fixed too."""
    src: I64
    dst: I64
    lat: F64
    dst_ptr: I64
    """CSR over ``dst``: the edges into node v are ``dst_ptr[v]:dst_ptr[v+1]``."""
    levels: list[tuple[I64, I64, I64, F64]] = field(default_factory=list)
    """Per topological level ≥ 1: nodes, edge sources, offsets of each node's edges, latencies."""

    @property
    def nodes(self) -> int:
        return len(self.kind)

    def to_networkx(self) -> nx.DiGraph:
        """The contracted DAG as a networkx graph: node weight ``gap + duration``, edge weight ``lat``.

        The replay does not use it (flat arrays are ~50× faster); tests check the replay against it.
        """
        g = nx.DiGraph()
        dur = self.internal + self.catsum.sum(axis=1)
        for v in range(self.nodes):
            g.add_node(v, kind=int(self.kind[v]), rank=int(self.rank_of[v]), weight=float(self.gap[v] + dur[v]),
                       base=float(self.a[v]) if self.kind[v] == ORIGIN else None)
        for s, d, lat in zip(self.src.tolist(), self.dst.tolist(), self.lat.tolist()):
            g.add_edge(s, d, lat=lat)
        return g


def _cuts_for_lane(lane: LaneTrace, markers: Sequence[int], before: set[int], after: set[int]) -> list[tuple[int, int]]:
    """Cut points as (end of the stretch on the left, start of the stretch on the right), sorted."""
    cuts = [(t, t) for t in markers]
    n = len(lane.events)
    for j in before | {i + 1 for i in after}:
        if 0 < j < n:
            cuts.append((int(lane.end[j - 1]), int(lane.start[j])))
    cuts.sort()
    return cuts


class _Builder:
    """Accumulates nodes and edges; one per assembly."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.rank_of: list[int] = []
        self.lane_of: list[int] = []
        self.a: list[int] = []
        self.b: list[int] = []
        self.catsum: list[F64] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.lat: list[float] = []

    def node(self, kind: int, rank: int, lane: int, a: int, b: int, catsum: F64) -> int:
        self.kind.append(kind)
        self.rank_of.append(rank)
        self.lane_of.append(lane)
        self.a.append(a)
        self.b.append(b)
        self.catsum.append(catsum[None, :])
        return len(self.kind) - 1

    def runs(self, rank: int, lane_index: int, lane: LaneTrace, cuts: list[tuple[int, int]]) -> list[int]:
        """Add the stretches of ``lane`` between ``cuts`` as nodes chained in program order; return their ids."""
        starts = [int(lane.start[0])] + [c[1] for c in cuts]
        ends = [c[0] for c in cuts] + [int(lane.end[-1])]
        ends = [max(e, s) for s, e in zip(starts, ends)]
        t = np.array(starts + ends, dtype=np.int64)
        busy = lane.busy(t)
        k = len(starts)
        sums = busy[k:] - busy[:k]
        first = len(self.kind)
        self.kind.extend([RUN] * k)
        self.rank_of.extend([rank] * k)
        self.lane_of.extend([lane_index] * k)
        self.a.extend(starts)
        self.b.extend(ends)
        self.catsum.append(sums)
        ids = list(range(first, first + k))
        self.src.extend(ids[:-1])
        self.dst.extend(ids[1:])
        self.lat.extend([0.0] * (k - 1))
        return ids

    def edge(self, s: int, d: int, lat: float = 0.0) -> None:
        self.src.append(s)
        self.dst.append(d)
        self.lat.append(lat)


def _last_before(lanes: Sequence[LaneTrace], phase: str, t: int, exclude: int) -> tuple[int, int] | None:
    """(lane index, task index) of the last task of ``phase`` ending by ``t`` on a lane other than ``exclude``."""
    best: tuple[int, int, int] | None = None
    for li, lane in enumerate(lanes):
        if li == exclude:
            continue
        for j, e in enumerate(lane.events):
            if e.phase == phase and lane.end[j] <= t and (best is None or lane.end[j] > best[0]):
                best = (int(lane.end[j]), li, j)
    return None if best is None else (best[1], best[2])


def _first(lanes: Sequence[LaneTrace], phase: str) -> tuple[int, int] | None:
    """(lane index, task index) of the earliest task of ``phase``."""
    best: tuple[int, int, int] | None = None
    for li, lane in enumerate(lanes):
        if phase in lane.phases:
            j = lane.phases.index(phase)
            if best is None or lane.start[j] < best[0]:
                best = (int(lane.start[j]), li, j)
    return None if best is None else (best[1], best[2])


def _last(lanes: Sequence[LaneTrace], phase: str) -> tuple[int, int] | None:
    """(lane index, task index) of the latest-ending task of ``phase``."""
    best: tuple[int, int, int] | None = None
    for li, lane in enumerate(lanes):
        if phase in lane.phases:
            j = len(lane.phases) - 1 - lane.phases[::-1].index(phase)
            if best is None or lane.end[j] > best[0]:
                best = (int(lane.end[j]), li, j)
    return None if best is None else (best[1], best[2])


def _cross_lane_edges(lanes: Sequence[LaneTrace]) -> list[tuple[int, int, int, int]]:
    """io → copy → first forward → first backward → update, where consecutive steps sit on different lanes."""
    edges: list[tuple[int, int, int, int]] = []
    for li, lane in enumerate(lanes):
        for j, e in enumerate(lane.events):
            if e.phase == "h2d":
                src = _last_before(lanes, "load", int(lane.start[j]), li)
                if src is not None:
                    edges.append((*src, li, j))
    for phase, before in (("forward", "h2d"), ("backward", "forward"), ("update", "backward")):
        dst = _first(lanes, phase)
        if dst is not None:
            src = _last_before(lanes, before, int(lanes[dst[0]].start[dst[1]]), dst[0])
            if src is not None:
                edges.append((*src, *dst))
    return edges


def assemble(
    events: Mapping[int, Sequence[Event]], offsets: Mapping[int, int], previous_end: Mapping[int, int]
) -> IterationDag:
    """Build the contracted DAG of one iteration.

    Args:
        events: rank → that rank's events of the iteration, on its own clock.
        offsets: rank → ns added to its clock to reach the common clock (missing: 0).
        previous_end: rank → end of its previous iteration on the common clock, where known.
    """
    ranks = tuple(sorted(r for r in events if events[r]))
    bld = _Builder()
    lanes: list[LaneTrace] = []
    comm: dict[int, list[Event]] = {}
    by_name: dict[str, CollectiveObs] = {}
    update_node: dict[int, int] = {}
    origin: dict[int, int] = {}
    zero = np.zeros(len(CATEGORIES))
    for r in ranks:
        off = offsets.get(r, 0)
        evs = events[r]
        names = set(map(_LANE, evs))
        per_lane: dict[str, list[Event]] = {}
        if len(names - {"comm"}) == 1:  # the usual case: one compute lane, in a single pass each
            (only,) = names - {"comm"}
            per_lane[only] = [e for e in evs if e[3] != "comm"] if "comm" in names else list(evs)
            comm[r] = [e for e in evs if e[3] == "comm"] if "comm" in names else []
        else:
            for e in evs:
                per_lane.setdefault(e.lane, []).append(e)
            comm[r] = per_lane.pop("comm", [])
        if not per_lane:
            per_lane["main"] = []
        rank_lanes = [LaneTrace(r, name, evs, off) for name, evs in sorted(per_lane.items()) if evs]
        first_start = min((int(lane.start[0]) for lane in rank_lanes), default=0)
        if not rank_lanes:
            # Only collectives: anchor them on an empty main lane at the rank's first ready.
            first_start = min((e.start_ns + off for e in comm[r]), default=0)
        origin[r] = min(previous_end.get(r, first_start), first_start)
        o = bld.node(ORIGIN, r, -1, origin[r], origin[r], zero)
        if not rank_lanes:
            continue
        cross = _cross_lane_edges(rank_lanes) if len(rank_lanes) > 1 else []
        upd = _last(rank_lanes, "update")
        bwd = _first(rank_lanes, "backward")
        marker_lane = bwd[0] if bwd else (upd[0] if upd else 0)
        ml = rank_lanes[marker_lane]
        lo = int(ml.start[0])
        # A bucket is ready before the update that waits for it, whatever the clocks say.
        hi = int(ml.end[-1])
        if upd and upd[0] == marker_lane:
            hi = int(ml.end[upd[1] - 1]) if upd[1] > 0 else int(ml.start[upd[1]])
        ready_at: list[tuple[int, Event]] = []
        for e in comm[r]:
            ready_at.append((min(max(e.start_ns + off, lo), hi), e))
        lane_ids: list[list[int]] = []
        for li, lane in enumerate(rank_lanes):
            before = {j for (_, _, dl, j) in cross if dl == li}
            after = {j for (sl, j, _, _) in cross if sl == li}
            if upd and upd[0] == li:
                before.add(upd[1])
            markers = [t for t, _ in ready_at] if li == marker_lane else []
            ids = bld.runs(r, len(lanes), lane, _cuts_for_lane(lane, markers, before, after))
            lanes.append(lane)
            lane_ids.append(ids)
            bld.edge(o, ids[0])
        for sl, sj, dl, dj in cross:
            bld.edge(_run_ending(bld, lane_ids[sl], int(rank_lanes[sl].end[sj])),
                     _run_starting(bld, lane_ids[dl], int(rank_lanes[dl].start[dj])))
        if upd:
            update_node[r] = _run_starting(bld, lane_ids[upd[0]], int(rank_lanes[upd[0]].start[upd[1]]))
        for t, e in ready_at:
            c = by_name.get(e.name)
            if c is None:
                c = by_name[e.name] = CollectiveObs(e.name, e.bytes)
            if r in c.ready:
                continue  # the same bucket twice in one iteration: keep the first
            c.ready[r], c.end[r] = t, max(e.end_ns + off, t)
            c.marker[r] = _run_ending(bld, lane_ids[marker_lane], t)
    collectives = _add_collectives(bld, list(by_name.values()), update_node, len(ranks))
    return _finish(bld, ranks, lanes, comm, collectives, {r: offsets.get(r, 0) for r in ranks}, origin)


def _run_ending(bld: _Builder, ids: list[int], t: int) -> int:
    """The last stretch of a lane that ends by ``t``: the one a cut at ``t`` closed."""
    return max(bisect.bisect_right(bld.b, t, ids[0], ids[-1] + 1) - 1, ids[0])


def _run_starting(bld: _Builder, ids: list[int], t: int) -> int:
    """The last stretch of a lane that starts by ``t``: the one a cut before the task starting at ``t`` opened."""
    return max(bisect.bisect_right(bld.a, t, ids[0], ids[-1] + 1) - 1, ids[0])


def _add_collectives(
    bld: _Builder, obs: list[CollectiveObs], update_node: Mapping[int, int], scale_row: int
) -> list[CollectiveObs]:
    """One node per collective; channel edges where the observation is serial; the last ones feed each update."""
    obs.sort(key=lambda c: (max(c.ready.values()), c.name))
    has_successor: set[int] = set()
    for k, c in enumerate(obs):
        latest = max(c.ready.values())
        end = max(c.end.values())
        # The comm channel is serial unless the ranks saw this collective finish before an earlier one did.
        prev = next((j for j in range(k - 1, -1, -1) if obs[j].end_ns <= end), None)
        start = latest if prev is None else max(latest, obs[prev].end_ns)
        c.start_ns, c.end_ns = start, max(end, start)
        cs = np.zeros(len(CATEGORIES))
        cs[ALLREDUCE] = c.end_ns - c.start_ns
        c.node = bld.node(COLLECTIVE, scale_row, -1, c.start_ns, c.end_ns, cs)
        for m in c.marker.values():
            bld.edge(m, c.node)
        if prev is not None:
            bld.edge(obs[prev].node, c.node)
            has_successor.add(prev)
    for r, u in update_node.items():
        for k, c in enumerate(obs):
            if k not in has_successor and r in c.end:
                # Each rank sees the collective end at its own instant: keep that as the edge's latency.
                bld.edge(c.node, u, float(c.end[r] - c.end_ns))
    return obs


def _finish(
    bld: _Builder, ranks: tuple[int, ...], lanes: list[LaneTrace], comm: dict[int, list[Event]],
    collectives: list[CollectiveObs], offsets: dict[int, int], origin: dict[int, int],
) -> IterationDag:
    n = len(bld.kind)
    a = np.array(bld.a, dtype=np.int64)
    b = np.array(bld.b, dtype=np.int64)
    catsum = np.concatenate(bld.catsum) if bld.catsum else np.zeros((0, len(CATEGORIES)))
    internal = np.maximum((b - a) - catsum.sum(axis=1), 0.0)
    src = np.array(bld.src, dtype=np.int64)
    dst = np.array(bld.dst, dtype=np.int64)
    lat = np.array(bld.lat, dtype=np.float64)
    level = _levels(n, src, dst)
    order = np.lexsort((dst, level[dst]))
    src, dst, lat = src[order], dst[order], lat[order]
    dst_counts = np.bincount(dst, minlength=n)
    dst_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(dst_counts, out=dst_ptr[1:])
    # Edges sorted by (level, dst) are also sorted by dst only within a level; keep a per-node CSR too.
    by_dst = np.argsort(dst, kind="stable")
    gap = np.zeros(n)
    has_pred = dst_counts > 0
    if len(src):
        pred_end = np.full(n, -np.inf)
        np.maximum.at(pred_end, dst, b[src] + lat)
        gap[has_pred] = np.maximum(a[has_pred] - pred_end[has_pred], 0.0)
    dag = IterationDag(ranks, lanes, comm, collectives, offsets, origin, np.array(bld.kind, dtype=np.int64),
                       np.array(bld.rank_of, dtype=np.int64), np.array(bld.lane_of, dtype=np.int64), a, b, catsum,
                       internal, gap, src[by_dst], dst[by_dst], lat[by_dst], dst_ptr)
    dag.levels = _level_plan(level, src, dst, lat)
    return dag


def _levels(n: int, src: I64, dst: I64) -> I64:
    """Longest hop count from a source for every node (raises on a cycle, which well-formed input never makes)."""
    level = np.zeros(n, dtype=np.int64)
    if not len(src):
        return level
    order = np.argsort(dst, kind="stable")
    s, d = src[order], dst[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    targets = d[starts]
    for _ in range(n + 1):
        new = np.maximum.reduceat(level[s] + 1, starts)
        if np.array_equal(new, level[targets]):
            return level
        level[targets] = new
    raise ValueError("the iteration's dependencies form a cycle")


def _level_plan(level: I64, src: I64, dst: I64, lat: F64) -> list[tuple[I64, I64, I64, F64]]:
    """Group the (level, dst)-sorted edges into per-level batches for the vectorized replay."""
    plan: list[tuple[I64, I64, I64, F64]] = []
    if not len(dst):
        return plan
    lv = level[dst]
    bounds = np.flatnonzero(np.r_[True, lv[1:] != lv[:-1], True])
    for i in range(len(bounds) - 1):
        e0, e1 = bounds[i], bounds[i + 1]
        d = dst[e0:e1]
        first = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
        plan.append((d[first], src[e0:e1], first, lat[e0:e1]))
    return plan
