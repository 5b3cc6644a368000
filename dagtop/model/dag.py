"""The cross-rank DAG of one iteration, with each rank's lane chains contracted between synchronisation points.

A node per task would cost ~1 µs per task in networkx; instead each lane of each rank is cut only where
something crosses it (a bucket becoming ready, the update waiting for the collectives, a copy feeding the
compute lane) and every stretch between two cuts becomes one node carrying its busy time per category
and its untimed host gaps. The graph then has O(ranks × buckets) nodes, held in flat numpy arrays; the
per-task detail stays in the :class:`~dagtop.model.table.EventTable` and is expanded only where the
critical path needs it. Assembly works on whole columns: Python loops run per rank with several lanes
(GPU jobs) and per collective, never per task.

Edges are precedence with a fixed latency: a node starts at ``max(pred end + latency) + gap`` where
``gap`` is the untimed host time observed in front of it. Collectives are single nodes fed by every
rank's bucket-ready point; they start at the latest ready time, after the previous collective on the
comm channel unless the observation shows them running concurrently. The update waits for the last ones.
FSDP's collectives (named ``all-gather …``, ``reduce-scatter …``) also gate the compute that follows them: the
rank's compute lane is cut again where one ends, the idle wait left out of the lanes, and the stretch after
the cut waits for the collective (:func:`~dagtop.model.gather_cuts.gather_cuts`).

Node ids. Rank by rank (in rank order): the rank's ORIGIN, then its RUNs lane by lane (lanes in the table's
order: copy, gpu, main) and in time order within a lane; after every rank, the COLLECTIVEs in the order of their
latest ready time. Two CPU ranks, one ``main`` lane each, two buckets, rank 1 a millisecond behind (ms)::

    rank 0   load 0–2  forward 2–4  backward 4–6 ┃ backward 6–8 ┃          update 11–12
    node     0 ORIGIN  1 RUN 0–6                   2 RUN 6–8      3 RUN 8–8  4 RUN 11–12
    rank 1   node 5 ORIGIN, nodes 6–9 its runs, cut at the same places (7, 9, 9)
    all      node 10 COLLECTIVE bucket 0 7–9, node 11 COLLECTIVE bucket 1 9–11

    ┃ a bucket becomes ready (the marker lane is cut there); node 3 is the empty stretch between the last ready
    point and the cut in front of the update.

    edges    0→1→2→3→4, 5→6→7→8→9    program order along each lane
             1→10, 6→10 · 3→11, 8→11  each rank's bucket-ready point into its collective
             10→11                    the comm channel, serial
             11→4, 11→9               the update waits for the last collective

>>> from instrument.events import Event
>>> def rank(late: int) -> list[Event]:
...     steps = [("io", "load", "next", "main", 0, 2), ("compute", "forward", "net", "main", 2, 4),
...              ("compute", "backward", "layer2", "main", 4, 6), ("allreduce", "allreduce", "bucket 0", "comm", 6, 9),
...              ("compute", "backward", "layer1", "main", 6, 8), ("allreduce", "allreduce", "bucket 1", "comm", 8, 11),
...              ("compute", "update", "step", "main", 11 - late, 12 - late)]
...     return [Event(c, p, n, lane, (a + late) * 10**6, (b + late) * 10**6, 100 * (lane == "comm"))
...             for c, p, n, lane, a, b in steps]
>>> dag = assemble({0: rank(0), 1: rank(1)}, {}, {0: 0, 1: 0})
>>> [["origin", "run", "collective"][k] for k in dag.kind.tolist()]
['origin', 'run', 'run', 'run', 'run', 'origin', 'run', 'run', 'run', 'run', 'collective', 'collective']
>>> dag.rank_of.tolist(), dag.lane_of.tolist()  # collectives: rank len(ranks), lane -1
([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2], [-1, 0, 0, 0, 0, -1, 1, 1, 1, 1, -1, -1])
>>> {v: sorted(dag.src[dag.dst == v].tolist()) for v in (4, 9, 10, 11)}  # into the updates and the collectives
{4: [3, 11], 9: [8, 11], 10: [1, 6], 11: [3, 8, 10]}
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import numpy.typing as npt

from dagtop.model.gather_cuts import disjoint, gather_cuts
from dagtop.model.levels import level_plan, levels
from dagtop.model.table import F64, I64, EventTable, build_table, run_starts
from instrument.events import CATEGORIES, CATEGORY_CODE, PHASE_CODE, SCRIPT, Event

ALLREDUCE = CATEGORY_CODE["allreduce"]
"""Column of the collectives' time in every per-category array."""

ORIGIN, RUN, COLLECTIVE = 0, 1, 2
"""Node kinds: a rank's fixed start, a contracted stretch of one lane, a collective across ranks."""

_BACKWARD, _UPDATE = PHASE_CODE["backward"], PHASE_CODE["update"]


@dataclass(slots=True)
class CollectiveObs:
    """One bucket's all-reduce as every rank saw it."""

    name: str
    bytes: int
    ready: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    marker: dict[int, int] = field(default_factory=dict)
    """Rank → the node that ends at that rank's bucket-ready point."""
    gate: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Rank → (the node of its compute lane that waits for this collective, that node's start), where it does:
    every rank of an FSDP all-gather (the unit computes with the gathered parameters), the ranks a reduce-scatter
    held (:data:`~dagtop.model.gather_cuts.GATHER_KINDS`). Empty for DDP's buckets."""
    node: int = -1
    start_ns: int = 0
    end_ns: int = 0


@dataclass(slots=True)
class IterationDag:
    """The contracted DAG of one iteration. Arrays are indexed by node; edges are sorted by destination."""

    ranks: tuple[int, ...]
    table: EventTable
    collectives: list[CollectiveObs]
    offsets: dict[int, int]
    """Rank → ns added to its clock to reach the common clock."""
    origin: dict[int, int]
    """Rank → when its iteration began: its previous update end, else its first task start."""
    kind: I64
    rank_of: I64
    """Node → rank; collectives carry ``len(ranks)``, the row of the scale matrix that is not a rank."""
    lane_of: I64
    """Node → lane of ``table`` (-1 for origins and collectives)."""
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


def _last_at_or_before(keys: I64, base: I64, lanes: I64, times: I64, t: EventTable) -> I64:
    """Per query, the last run of ``lanes[i]`` whose key time is ≤ ``times[i]`` (else the lane's first run)."""
    q = lanes * t.span + np.clip(times - t.t0, 0, t.span - 1)
    found: I64 = np.maximum(np.searchsorted(keys, q, side="right") - 1, base[lanes])
    return found


def assemble(
    events: Mapping[int, Sequence[Event]], offsets: Mapping[int, int], previous_end: Mapping[int, int]
) -> IterationDag:
    """Build the contracted DAG of one iteration.

    Args:
        events: rank → that rank's events of the iteration, on its own clock (decoded frames carry columns).
        offsets: rank → ns added to its clock to reach the common clock (missing: 0).
        previous_end: rank → end of its previous iteration on the common clock, where known.
    """
    t = build_table(events, offsets)
    ranks, n_ranks, n_lanes = t.ranks, len(t.ranks), t.lanes
    rank_numbers = np.array(ranks, dtype=np.int64)
    lane_first, lane_last = t.start[t.lane_lo], t.end[t.lane_hi - 1]
    has_lanes = t.rank_lane_hi > t.rank_lane_lo

    # The script's own collectives (instrument/collectives.py) hold the training thread wherever they are called:
    # before its first task (a barrier after the last step), or between the backward and the update.
    script = np.fromiter((SCRIPT in name for name in t.comm_names), dtype=bool, count=len(t.comm_names))
    early = np.full(n_ranks, np.iinfo(np.int64).max, dtype=np.int64)
    if script.any():
        np.minimum.at(early, t.comm_rank_idx[script], t.comm_start[script])

    # Each rank's origin: its previous update end, or its first task (or first script collective).
    first_start = np.zeros(n_ranks, dtype=np.int64)
    if n_lanes:
        first_start[has_lanes] = np.minimum.reduceat(lane_first, t.rank_lane_lo[has_lanes])
    first_start = np.minimum(first_start, early)
    if not has_lanes.all():  # only collectives: anchored at the rank's first ready
        comm_first = np.flatnonzero(run_starts(t.comm_rank_idx))
        alone = ~has_lanes[t.comm_rank_idx[comm_first]]
        first_start[t.comm_rank_idx[comm_first[alone]]] = t.comm_start[comm_first[alone]]
    origin = {r: min(previous_end.get(r, fs), fs) for r, fs in zip(ranks, first_start.tolist())}

    # Where each rank's buckets become ready: the lane of its backward pass, before its update.
    bwd, upd = t.first_per_rank(_BACKWARD), t.last_per_rank(_UPDATE)
    marker_lane = np.zeros(n_ranks, dtype=np.int64)
    lo, hi = first_start.copy(), first_start.copy()
    hi_script = hi
    if n_lanes:
        lane_of_bwd, lane_of_upd = t.lane_of[bwd.clip(0)], t.lane_of[upd.clip(0)]
        marker_lane = np.where(bwd >= 0, lane_of_bwd, np.where(upd >= 0, lane_of_upd, t.rank_lane_lo))
        marker_lane[~has_lanes] = 0
        if script.any():  # the marker lane begins at the rank's first script collective, if that came first
            lane_first = lane_first.copy()
            np.minimum.at(lane_first, marker_lane[has_lanes], early[has_lanes])
        lo, hi = lane_first[marker_lane], lane_last[marker_lane].copy()
        hi_script = hi.copy()
        # A bucket is ready before the update that waits for it, whatever the clocks say; a script collective
        # before the update itself (it may come after the task before it).
        upd_on_marker = (upd >= 0) & (lane_of_upd == marker_lane)
        u = upd[upd_on_marker]
        hi[upd_on_marker] = np.where(u > t.lane_lo[t.lane_of[u]], t.end[u - 1], t.start[u])
        hi_script[upd_on_marker] = t.start[u]

    cross = [e for r in np.flatnonzero(t.rank_lane_hi - t.rank_lane_lo > 1).tolist() for e in t.cross_lane_edges(r)]
    cross_src = np.array([s for s, _ in cross], dtype=np.int64)
    cross_dst = np.array([d for _, d in cross], dtype=np.int64)

    # Cuts: at every bucket-ready point on the marker lane, before each cross-lane destination and the
    # update, after each cross-lane source. A cut is (end of the stretch on its left, start on its right).
    with_lanes = has_lanes[t.comm_rank_idx]
    c_rank = t.comm_rank_idx[with_lanes]
    c_hi = np.where(script[with_lanes], hi_script[c_rank], hi[c_rank])
    ready = np.minimum(np.maximum(t.comm_start[with_lanes], lo[c_rank]), c_hi)
    c_end = np.maximum(t.comm_end[with_lanes], ready)
    before = np.unique(np.concatenate([upd[upd >= 0], cross_dst, cross_src + 1]))
    before = before[before < len(t.start)]
    before = before[before > t.lane_lo[t.lane_of[before]]]  # never before a lane's first task
    g_idx, g_lane, g_left, g_right = gather_cuts(t, with_lanes, c_rank, marker_lane, ready, c_end, c_hi)
    cut_lane = np.concatenate([marker_lane[c_rank], t.lane_of[before], g_lane]).astype(np.int64)
    cut_left = np.concatenate([ready, t.end[before - 1], g_left])
    cut_right = np.concatenate([ready, t.start[before], g_right])
    order = np.lexsort((cut_right, cut_left, cut_lane))
    if len(g_idx):
        order = disjoint(order, cut_lane, cut_left, cut_right, t)
    cut_lane, cut_left, cut_right = cut_lane[order], cut_left[order], cut_right[order]

    # Runs: the stretches between cuts, lane by lane; node ids: per rank its origin, then its runs.
    n_cuts = np.bincount(cut_lane, minlength=n_lanes)
    run_base = np.zeros(n_lanes + 1, dtype=np.int64)
    np.cumsum(n_cuts + 1, out=run_base[1:])
    n_runs = int(run_base[-1])
    run_lane = np.repeat(np.arange(n_lanes, dtype=np.int64), n_cuts + 1)
    run_start = np.empty(n_runs, dtype=np.int64)
    run_end = np.empty(n_runs, dtype=np.int64)
    cut_base = run_base[:-1] - np.arange(n_lanes)  # index of a lane's first cut among all cuts
    position = np.arange(len(cut_lane)) - cut_base[cut_lane]
    run_start[run_base[:-1]] = lane_first
    run_end[run_base[1:] - 1] = lane_last
    run_end[run_base[cut_lane] + position] = cut_left
    run_start[run_base[cut_lane] + position + 1] = cut_right
    run_end = np.maximum(run_end, run_start)
    busy = t.busy(np.concatenate((run_lane, run_lane)), np.concatenate((run_start, run_end)))
    catsum = busy[n_runs:] - busy[:n_runs]
    run_rank = t.lane_rank[run_lane]
    runs_per_rank = np.bincount(run_rank, minlength=n_ranks)
    origin_node = np.cumsum(runs_per_rank + 1) - runs_per_rank - 1
    run_node = np.arange(n_runs, dtype=np.int64) + run_rank + 1

    # Edges in the order each destination sees them (ties on the critical path go to the first).
    first_run = np.zeros(n_runs, dtype=bool)
    first_run[run_base[:-1]] = True
    src: list[I64] = [np.where(first_run, origin_node[run_rank], run_node - 1)]
    dst: list[I64] = [run_node]
    lat: list[F64] = [np.zeros(n_runs)]
    end_key = run_lane * t.span + np.clip(run_end - t.t0, 0, t.span - 1)
    start_key = run_lane * t.span + np.clip(run_start - t.t0, 0, t.span - 1)
    if cross:
        s_run = _last_at_or_before(end_key, run_base, t.lane_of[cross_src], t.end[cross_src], t)
        d_run = _last_at_or_before(start_key, run_base, t.lane_of[cross_dst], t.start[cross_dst], t)
        src.append(run_node[s_run])
        dst.append(run_node[d_run])
        lat.append(np.zeros(len(cross)))
    has_upd = (upd >= 0) & has_lanes
    update_node = dict(zip(rank_numbers[has_upd].tolist(), run_node[_last_at_or_before(
        start_key, run_base, t.lane_of[upd[has_upd]], t.start[upd[has_upd]], t)].tolist()))
    marker = run_node[_last_at_or_before(end_key, run_base, marker_lane[c_rank], ready, t)]
    gate = np.full(len(c_rank), -1, dtype=np.int64)
    gate_start = np.zeros(len(c_rank), dtype=np.int64)
    if len(g_idx):
        # Cut k of a lane ends the lane's run k and starts its run k + 1. The gated run is the one right of the
        # wait's cut; the ready point is taken by position too: by time, it could be an empty run past the wait.
        sorted_at = np.empty(len(order), dtype=np.int64)
        sorted_at[order] = np.arange(len(order))
        k = sorted_at[len(order) - len(g_idx):]
        after = run_base[cut_lane[k]] + position[k] + 1
        gate[g_idx], gate_start[g_idx] = run_node[after], run_start[after]
        k = sorted_at[g_idx]  # the ready cuts come first, one per collective's event
        marker[g_idx] = run_node[run_base[cut_lane[k]] + position[k]]

    obs = _observe(t, with_lanes, c_rank, ready, c_end, marker, gate, gate_start)
    n_base = n_ranks + n_runs
    c_src, c_dst, c_lat = _collective_edges(obs, update_node, n_base)
    src.append(c_src)
    dst.append(c_dst)
    lat.append(c_lat)

    n = n_base + len(obs)
    kind = np.full(n, COLLECTIVE, dtype=np.int64)
    kind[origin_node] = ORIGIN
    kind[run_node] = RUN
    rank_of = np.full(n, n_ranks, dtype=np.int64)
    rank_of[origin_node] = rank_numbers
    rank_of[run_node] = rank_numbers[run_rank]
    lane_of = np.full(n, -1, dtype=np.int64)
    lane_of[run_node] = run_lane
    a = np.empty(n, dtype=np.int64)
    b = np.empty(n, dtype=np.int64)
    a[origin_node] = b[origin_node] = list(origin.values())
    a[run_node], b[run_node] = run_start, run_end
    all_catsum = np.zeros((n, len(CATEGORIES)))
    all_catsum[run_node] = catsum
    for c in obs:
        a[c.node], b[c.node] = c.start_ns, c.end_ns
        all_catsum[c.node, ALLREDUCE] = c.end_ns - c.start_ns
    return _finish(t, obs, {r: int(o) for r, o in zip(ranks, t.offsets.tolist())}, origin, kind, rank_of,
                   lane_of, a, b, all_catsum, np.concatenate(src), np.concatenate(dst), np.concatenate(lat))


def _observe(t: EventTable, with_lanes: npt.NDArray[np.bool_], c_rank: I64, ready: I64, c_end: I64, marker: I64,
             gate: I64, gate_start: I64) -> list[CollectiveObs]:
    """One observation per bucket name, from every rank that reported it (its first report, if several)."""
    names = list(itertools.compress(t.comm_names, with_lanes.tolist()))
    if not names:
        return []
    first_name = list(dict.fromkeys(names))
    ids = {n: i for i, n in enumerate(first_name)}
    cid = np.fromiter(map(ids.__getitem__, names), dtype=np.int64, count=len(names))
    src = t.comm_src[with_lanes]
    nbytes = t.comm_bytes[with_lanes]
    o = np.lexsort((src, c_rank, cid))
    o = o[run_starts(cid[o]) | run_starts(c_rank[o])]
    bounds = np.append(np.flatnonzero(run_starts(cid[o])), len(o))
    ranks = np.array(t.ranks, dtype=np.int64)[c_rank[o]].tolist()
    ready_l, end_l, marker_l = ready[o].tolist(), c_end[o].tolist(), marker[o].tolist()
    gate_l, gate_start_l = gate[o].tolist(), gate_start[o].tolist()
    gated = bool((gate >= 0).any())
    obs = []
    for k in range(len(bounds) - 1):
        i, j = int(bounds[k]), int(bounds[k + 1])
        rs = ranks[i:j]
        c = CollectiveObs(first_name[int(cid[o[i]])], int(nbytes[o[i]]), dict(zip(rs, ready_l[i:j])),
                          dict(zip(rs, end_l[i:j])), dict(zip(rs, marker_l[i:j])))
        if gated:
            c.gate = {r: (g, at) for r, g, at in zip(rs, gate_l[i:j], gate_start_l[i:j]) if g >= 0}
        obs.append(c)
    return obs


def _collective_edges(obs: list[CollectiveObs], update_node: Mapping[int, int], base: int
                      ) -> tuple[I64, I64, F64]:
    """Number the collectives in order of their latest ready time; edges from the ready points, along the
    comm channel where the observation is serial, and from the last ones into each rank's update."""
    obs.sort(key=lambda c: (max(c.ready.values()), c.name))
    src: list[int] = []
    dst: list[int] = []
    lat: list[float] = []
    has_successor: set[int] = set()
    for k, c in enumerate(obs):
        latest = max(c.ready.values())
        end = max(c.end.values())
        # The comm channel is serial unless the ranks saw this collective finish before an earlier one did. It is
        # each rank's: collectives of disjoint groups (HSDP's shard groups) do not wait for each other.
        prev = next((j for j in range(k - 1, -1, -1) if obs[j].end_ns <= end and not c.ready.keys().isdisjoint(
            obs[j].ready)), None)
        start = latest if prev is None else max(latest, obs[prev].end_ns)
        c.start_ns, c.end_ns, c.node = start, max(end, start), base + k
        src.extend(c.marker.values())
        dst.extend([c.node] * len(c.marker))
        lat.extend([0.0] * len(c.marker))
        if prev is not None:
            src.append(obs[prev].node)
            dst.append(c.node)
            lat.append(0.0)
            has_successor.add(prev)
        for r, (node, node_start) in c.gate.items():
            # The rank resumes when it sees the collective end (or where it did resume, if the lane's cut is earlier).
            src.append(c.node)
            dst.append(node)
            lat.append(float(min(c.end[r], node_start) - c.end_ns))
    for k, c in enumerate(obs):
        if k in has_successor:
            continue
        for r, end_r in c.end.items():
            if r in update_node:
                # Each rank sees the collective end at its own instant: keep that as the edge's latency.
                src.append(c.node)
                dst.append(update_node[r])
                lat.append(float(end_r - c.end_ns))
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(lat, dtype=np.float64)


def _finish(t: EventTable, collectives: list[CollectiveObs], offsets: dict[int, int], origin: dict[int, int],
            kind: I64, rank_of: I64, lane_of: I64, a: I64, b: I64, catsum: F64, src: I64, dst: I64, lat: F64
            ) -> IterationDag:
    n = len(kind)
    internal = np.maximum((b - a) - catsum.sum(axis=1), 0.0)
    level = levels(n, src, dst)
    order = np.lexsort((dst, level[dst]))
    src, dst, lat = src[order], dst[order], lat[order]
    dst_counts = np.bincount(dst, minlength=n)
    dst_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(dst_counts, out=dst_ptr[1:])
    # Edges sorted by (level, dst) are also sorted by dst only within a level; keep a per-node CSR too.
    by_dst = np.argsort(dst, kind="stable")
    csr_src, csr_dst, csr_lat = src[by_dst], dst[by_dst], lat[by_dst]
    gap = np.zeros(n)
    has_pred = dst_counts > 0
    if len(src):
        pred_end = np.maximum.reduceat(b[csr_src] + csr_lat, dst_ptr[:-1][has_pred])
        gap[has_pred] = np.maximum(a[has_pred] - pred_end, 0.0)
    dag = IterationDag(t.ranks, t, collectives, offsets, origin, kind, rank_of, lane_of, a, b, catsum,
                       internal, gap, csr_src, csr_dst, csr_lat, dst_ptr)
    dag.levels = level_plan(level, src, dst, lat)
    return dag
