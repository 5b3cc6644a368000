"""One iteration's events of every rank as flat numpy columns, grouped by lane: what the DAG is built from.

Nothing here walks the events one by one in Python: a 64-rank iteration has tens of thousands of them, and
the whole analysis has 20 ms. The decoder already hands each rank's events over as columns
(:class:`~instrument.wire.EventColumns`); this module concatenates them, puts every lane in time order and
answers "how busy was this lane, per category, before time t" for many lanes and times at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dagtop.model.tasks import LANE_NAMES, TaskColumns, Tasks
from instrument.events import CATEGORIES, CATEGORY_CODE, LANE_CODE, LANES, PHASE_CODE, Event, EventColumns

_LOAD, _H2D, _FORWARD, _BACKWARD, _UPDATE = (PHASE_CODE[p] for p in ("load", "h2d", "forward", "backward", "update"))
COMM = LANE_CODE["comm"]
_ALLREDUCE_CATEGORY, _ALLREDUCE_PHASE = CATEGORY_CODE["allreduce"], PHASE_CODE["allreduce"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_LANE_RANK = np.array([sorted(LANES).index(name) for name in LANES], dtype=np.int64)
"""Wire lane code → position among a rank's lanes: by name (copy, gpu, main), as the DAG numbers them."""


def run_starts(x: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """True where ``x`` differs from the element before (the first always): the starts of runs of equal values."""
    out = np.ones(len(x), dtype=bool)
    np.not_equal(x[1:], x[:-1], out=out[1:])
    return out


def run_ends(x: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """True where ``x`` differs from the element after (the last always): the ends of runs of equal values."""
    out = np.ones(len(x), dtype=bool)
    np.not_equal(x[1:], x[:-1], out=out[:-1])
    return out


def concat_ranges(lo: I64, hi: I64) -> I64:
    """``lo[0]:hi[0]``, ``lo[1]:hi[1]``, ... as one array, without a Python loop."""
    sizes = hi - lo
    out: I64 = np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(lo - (np.cumsum(sizes) - sizes), sizes)
    return out


def _column(columns: Sequence[EventColumns], field: str, dtype: type) -> Any:
    parts: list[npt.NDArray[Any]] = [np.frombuffer(getattr(c, field), dtype=dtype) for c in columns]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


@dataclass(slots=True)
class EventTable:
    """Every event of one iteration on the common clock, in two sorted parts.

    Compute events (every lane but ``comm``) are sorted by rank index, then by lane in name order (``copy``,
    ``gpu``, ``main``: the order the DAG numbers a rank's lanes), then in time order within the lane: by start,
    a task that takes no time before one that starts with it (by end), full ties in arrival order. Each lane is
    then one slice ``lane_lo:lane_hi`` of the compute arrays. The collectives' events are kept apart, sorted by
    (rank index, start), ties in arrival order. ``src`` and ``comm_src`` give each row's index in its rank's
    frame. One rank whose events arrived in this order::

        arrival  lane  name      start–end
        0        main  forward   2–5
        1        comm  bucket 0  5–7
        2        main  load      0–2
        3        gpu   kernel    3–4
        4        main  backward  5–8
        5        main  mark      5–5

    gives compute rows ``kernel, load, forward, mark, backward`` (``src`` 3, 2, 0, 5, 4; lane ``gpu`` is rows
    0:1, lane ``main`` rows 1:5) and comm rows ``bucket 0`` (``comm_src`` 1).

    Arrays named ``start``, ``end``, ... are per compute event; ``lane_*`` per lane; ``comm_*`` per comm event;
    per-category arrays have a column per entry of :data:`~instrument.events.CATEGORIES`, in its order.
    """

    ranks: tuple[int, ...]
    offsets: I64
    """Per rank index: ns added to its clock."""
    source: list[EventColumns]
    """Per rank index: its events as they arrived (names are read from here, by ``src``)."""
    rank_idx: I64
    src: I64
    """Index of the event in its rank's ``source``."""
    start: I64
    end: I64
    """Never before ``start`` (a task that ends before it starts is a point)."""
    end_raw: I64
    cat: I64
    phase: I64
    nbytes: I64
    lane_rank: I64
    """Lane → rank index. Lanes are ordered by rank, then by name."""
    lane_code: I64
    lane_lo: I64
    lane_hi: I64
    """Lane → its events are ``lo:hi``."""
    lane_of: I64
    """Event → its lane."""
    rank_lane_lo: I64
    rank_lane_hi: I64
    """Rank index → its lanes are ``lo:hi`` (none for a rank that sent only collectives)."""
    cum: npt.NDArray[np.int64]
    """(events + 1, categories): busy ns per category of the events before each one, over the whole table."""
    comm_rank_idx: I64
    comm_src: I64
    comm_start: I64
    comm_end: I64
    comm_bytes: I64
    comm_names: list[str]
    t0: int
    span: int
    key: I64
    """lane × span + (start − t0): sorted, so one searchsorted finds a time in any lane."""

    @property
    def lanes(self) -> int:
        return len(self.lane_lo)

    def busy(self, lanes: I64, times: I64) -> F64:
        """Busy ns per category on ``lanes[i]`` before ``times[i]`` (rows: queries, columns: categories)."""
        n = len(lanes)
        out = np.zeros((n, len(CATEGORIES)))
        if n == 0:
            return out
        rel = np.clip(times - self.t0, 0, self.span - 1)
        j = np.searchsorted(self.key, lanes * self.span + rel, side="right") - 1
        lo = self.lane_lo[lanes]
        inside = j >= lo
        jc = np.where(inside, j, lo)
        out[:] = self.cum[jc] - self.cum[lo]
        part = np.clip(times - self.start[jc], 0, self.end[jc] - self.start[jc]).astype(np.float64)
        out[np.arange(n), self.cat[jc]] += part
        out[~inside] = 0.0
        return out

    def first_per_rank(self, phase: int) -> I64:
        """Rank index → its earliest event of ``phase`` (earliest start, then lane order), or -1."""
        out = np.full(len(self.ranks), -1, dtype=np.int64)
        idx = np.flatnonzero(self.phase == phase)
        if len(idx):
            lanes = self.lane_of[idx]
            firsts = idx[run_starts(lanes)]  # lanes are in time order: the first of each lane
            rk = self.rank_idx[firsts]
            o = np.lexsort((firsts, self.start[firsts], rk))
            o = o[run_starts(rk[o])]
            out[rk[o]] = firsts[o]
        return out

    def last_per_rank(self, phase: int) -> I64:
        """Rank index → the last event of ``phase`` on the lane where that one ends latest (lane order on ties),
        or -1."""
        out = np.full(len(self.ranks), -1, dtype=np.int64)
        idx = np.flatnonzero(self.phase == phase)
        if len(idx):
            lanes = self.lane_of[idx]
            lasts = idx[run_ends(lanes)]
            rk = self.rank_idx[lasts]
            o = np.lexsort((lasts, -self.end[lasts], rk))
            o = o[run_starts(rk[o])]
            out[rk[o]] = lasts[o]
        return out

    def cross_lane_edges(self, r: int) -> list[tuple[int, int]]:
        """(source event, destination event) for io → copy → first forward → first backward → update, where
        consecutive steps of rank index ``r`` sit on different lanes (a GPU job: main, copy and gpu lanes)."""
        lo, hi = int(self.lane_lo[self.rank_lane_lo[r]]), int(self.lane_hi[self.rank_lane_hi[r] - 1])
        phase, lane, start, end = self.phase[lo:hi], self.lane_of[lo:hi], self.start[lo:hi], self.end[lo:hi]

        def last_before(p: int, time: int, exclude: int) -> int | None:
            ok = np.flatnonzero((phase == p) & (end <= time) & (lane != exclude))
            return None if not len(ok) else lo + int(ok[np.argmax(end[ok])])  # the first of the latest-ending

        edges = []
        for j in np.flatnonzero(phase == _H2D).tolist():
            src = last_before(_LOAD, int(start[j]), int(lane[j]))
            if src is not None:
                edges.append((src, lo + j))
        for p, before in ((_FORWARD, _H2D), (_BACKWARD, _FORWARD), (_UPDATE, _BACKWARD)):
            cand = np.flatnonzero(phase == p)
            if not len(cand):
                continue
            lanes = lane[cand]
            firsts = cand[run_starts(lanes)]
            dst = int(firsts[np.argmin(start[firsts])])
            src = last_before(before, int(start[dst]), int(lane[dst]))
            if src is not None:
                edges.append((src, lo + dst))
        return edges

    def tasks(self) -> Tasks:
        """Every event as a :class:`Task` on the common clock (compute lanes in order, then each rank's
        collectives in arrival order): the columns, each rank's rows being the two runs it occupies (its compute
        lanes, its collectives). The tuples are made when read (:mod:`dagtop.model.tasks`)."""
        ranks = np.array(self.ranks, dtype=np.int64)
        names = np.array(list(itertools.chain.from_iterable(c.name for c in self.source)), dtype=object)
        base = np.zeros(len(self.source) + 1, dtype=np.int64)
        np.cumsum([len(c) for c in self.source], out=base[1:])
        order = np.lexsort((self.comm_src, self.comm_rank_idx))
        c_rank, c_src = self.comm_rank_idx[order], self.comm_src[order]
        collectives = len(order)
        columns = TaskColumns(
            rank=np.concatenate([ranks[self.rank_idx], ranks[c_rank]]),
            category=np.concatenate([self.cat, np.full(collectives, _ALLREDUCE_CATEGORY, dtype=self.cat.dtype)]),
            phase=np.concatenate([self.phase, np.full(collectives, _ALLREDUCE_PHASE, dtype=self.phase.dtype)]),
            name=np.concatenate([base[self.rank_idx] + self.src, base[c_rank] + c_src]),
            lane=np.concatenate([np.repeat(self.lane_code, self.lane_hi - self.lane_lo),
                                 np.full(collectives, COMM, dtype=np.int64)]),
            start_ns=np.concatenate([self.start, self.comm_start[order]]),
            end_ns=np.concatenate([self.end_raw, self.comm_end[order]]),
            bytes=np.concatenate([self.nbytes, self.comm_bytes[order]]),
            names=names,
        )
        # Compute events are sorted by rank, and so are the collectives after them: two runs of rows per rank.
        every = np.arange(len(ranks))
        k_lo = np.searchsorted(self.rank_idx, every, side="left").tolist()
        k_hi = np.searchsorted(self.rank_idx, every, side="right").tolist()
        c_lo = (np.searchsorted(c_rank, every, side="left") + len(self.start)).tolist()
        c_hi = (np.searchsorted(c_rank, every, side="right") + len(self.start)).tolist()
        lane_names = LANE_NAMES[self.lane_code].tolist()
        l_lo, l_hi = self.rank_lane_lo.tolist(), self.rank_lane_hi.tolist()
        rows: dict[int, list[tuple[int, int]]] = {}
        lanes_of: dict[int, tuple[str, ...]] = {}
        for i, r in enumerate(self.ranks):
            runs = [(lo, hi) for lo, hi in ((k_lo[i], k_hi[i]), (c_lo[i], c_hi[i])) if hi > lo]
            if runs:
                rows[r] = runs
            lanes_of[r] = tuple(lane_names[l_lo[i]:l_hi[i]]) + (("comm",) if c_hi[i] > c_lo[i] else ())
        return Tasks.of_columns(columns, rows, lanes_of)


def build_table(events: Mapping[int, Sequence[Event]], offsets: Mapping[int, int]) -> EventTable:
    """The table of one iteration from each rank's events (on its own clock) and its clock offset."""
    ranks = tuple(sorted(r for r in events if len(events[r])))
    source = [EventColumns.of(events[r]) for r in ranks]
    counts = np.array([len(c) for c in source], dtype=np.int64)
    rank_idx = np.repeat(np.arange(len(ranks), dtype=np.int64), counts)
    src = concat_ranges(np.zeros(len(counts), dtype=np.int64), counts)  # index of each event in its frame
    off = np.array([offsets.get(r, 0) for r in ranks], dtype=np.int64)
    lane = _column(source, "lane", np.int8).astype(np.int64)
    start = _column(source, "start_ns", np.int64) + off[rank_idx]
    end = _column(source, "end_ns", np.int64) + off[rank_idx]

    comm = lane == COMM
    c_idx = np.flatnonzero(comm)
    c_order = c_idx[np.lexsort((start[c_idx], rank_idx[c_idx]))]
    comm_names: list[str] = []
    c_rank, c_src = rank_idx[c_order], src[c_order]
    bounds = np.append(np.flatnonzero(run_starts(c_rank)), len(c_rank)).tolist()
    for lo, hi in itertools.pairwise(bounds):
        comm_names.extend(map(source[int(c_rank[lo])].name.__getitem__, c_src[lo:hi].tolist()))

    # Compute lanes: group by (rank, lane) keeping arrival order, then make sure each lane is in time order.
    k_idx = np.flatnonzero(~comm)
    group = rank_idx[k_idx] * len(_LANE_RANK) + _LANE_RANK[lane[k_idx]]
    if len(ranks) * len(_LANE_RANK) < 1 << 15:
        group = group.astype(np.int16)  # numpy sorts 16-bit keys by radix: linear time
    order = np.argsort(group, kind="stable")
    g, s, e = group[order], start[k_idx][order], end[k_idx][order]
    # Time order within a lane: by start, and a task that takes no time before one that starts with it.
    if bool(((g[1:] == g[:-1]) & ((s[1:] < s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] < e[:-1])))).any()):
        order = np.lexsort((end[k_idx], start[k_idx], group))  # stable: full ties keep arrival order
        g = group[order]
    k = k_idx[order]
    lane_lo = np.flatnonzero(run_starts(g)).astype(np.int64)
    lane_hi = np.append(lane_lo[1:], len(g)).astype(np.int64)
    lane_rank = rank_idx[k][lane_lo]
    lane_of = np.repeat(np.arange(len(lane_lo), dtype=np.int64), lane_hi - lane_lo)
    k_start = start[k]
    k_end_raw = end[k]
    k_end = np.maximum(k_end_raw, k_start)
    cat = _column(source, "category", np.int8).astype(np.int64)[k]
    sizes = _column(source, "bytes", np.int64)
    per_task = np.zeros((len(k), len(CATEGORIES)), dtype=np.int64)
    per_task[np.arange(len(k)), cat] = k_end - k_start
    cum = np.zeros((len(k) + 1, len(CATEGORIES)), dtype=np.int64)
    np.cumsum(per_task, axis=0, out=cum[1:])

    t0 = int(k_start.min()) if len(k) else 0
    span = (int(k_end.max()) - t0 + 2) if len(k) else 2
    if len(lane_lo) * span >= 1 << 62:  # 13 days with 4096 lanes: clocks gone wrong, not a real iteration
        raise ValueError(f"the iteration's events span {span / 1e9:.0f} s: too long to analyse")
    key = lane_of * span + (k_start - t0)
    rank_lane_lo = np.searchsorted(lane_rank, np.arange(len(ranks)), side="left").astype(np.int64)
    rank_lane_hi = np.searchsorted(lane_rank, np.arange(len(ranks)), side="right").astype(np.int64)
    return EventTable(
        ranks=ranks, offsets=off, source=source, rank_idx=rank_idx[k], src=src[k], start=k_start, end=k_end,
        end_raw=k_end_raw, cat=cat, phase=_column(source, "phase", np.int8).astype(np.int64)[k], nbytes=sizes[k],
        lane_rank=lane_rank, lane_code=lane[k][lane_lo], lane_lo=lane_lo, lane_hi=lane_hi, lane_of=lane_of,
        rank_lane_lo=rank_lane_lo, rank_lane_hi=rank_lane_hi, cum=cum,
        comm_rank_idx=rank_idx[c_order], comm_src=src[c_order], comm_start=start[c_order], comm_end=end[c_order],
        comm_bytes=sizes[c_order], comm_names=comm_names, t0=t0, span=span, key=key,
    )
