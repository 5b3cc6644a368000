"""How much compute slows while a collective is in flight, fitted from the job's own tasks, and its use in a replay.

Communication and computation share the machine: gloo's threads take cores from the training thread, NCCL's
kernels take SMs and memory bandwidth from the compute kernels beside them. A replay that holds every compute
duration fixed then over-predicts what removing communication leaves behind. The job itself shows the effect:
the same block (rank, lane, phase, name) runs in many iterations, partly overlapped by collectives in some, less or
not at all in others. Within each block, duration against the fraction of it that a collective overlapped is a line
``d = d₀ (1 + k·f)``; :class:`InterferenceFit` fits one ``k`` per lane, pooled over blocks, ranks and iterations
(each block against its own mean, so blocks of every size count alike), with its standard error.

A change that scales the collectives' time by ρ scales each run node's overlap ``f`` to ``min(ρ f, 1)`` and its
compute by ``(1 + k·min(ρ f, 1)) / (1 + k·f)`` (:func:`compute_factors`): ×1 for the identity, so the identity
replay stays exact, and monotone in ρ for ``k ≥ 0``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from dagtop.model.dag import RUN, IterationDag
from dagtop.model.snapshot import Interference
from dagtop.model.table import F64, I64
from instrument.events import CATEGORY_CODE, LANES

COMPUTE = CATEGORY_CODE["compute"]

MIN_SPREAD = 1.0
"""Least within-block spread of the overlap fraction, Σ (f − f̄)² over all samples of a lane, for a fit: about
two blocks seen once fully overlapped and once not. Below it the data cannot tell interference from noise."""
PER_BLOCK = 64
"""Samples kept per block: the latest, so a job that changes pace is followed."""
TASKS_PER_ITERATION = 2048
"""Compute tasks sampled per iteration at most (a strided sample, so a big job keeps the same blocks)."""
REFIT_EVERY = 8
"""Iterations added between two fits: the fit moves slowly, and the live monitor analyses every iteration."""
MAX_BLOCKS = 4096
"""Blocks followed at most (a job with more names per iteration is sampled by its first blocks)."""
MIN_MAD = 1e-3
"""Floor of the residuals' spread (a fraction of a block's length) when judging outliers."""
_OUTLIER_MADS = 5.0
"""A sample whose residual is this many MADs out (the machine busy with something else) is left out of the fit."""


@dataclass(slots=True)
class InterferenceFit:
    """Running samples (overlap fraction, duration) per block, and the pooled within-block fit per lane."""

    blocks: dict[tuple[int, int, int, str], deque[tuple[float, float]]] = field(default_factory=dict)
    """(rank, lane code, phase code, name) → its latest (overlap fraction, duration). A unit's forward and its
    backward are two blocks: pooled as one, the forward never overlapped and the backward, about twice as long,
    overlapped, the fit read the backward's own length as the collectives' doing (a transformer on 2 CPU ranks,
    whose last layer's backward ran under its first bucket: k = 1.45 ± 0.02, which replayed 'perfect overlap' at
    175 ms where a no-op comm hook's re-run took 198; every bundled recording read k = 0.4-1.2 so)."""
    _fitted: dict[str, Interference] = field(default_factory=dict)
    _since: int = 0
    """Iterations added since the last fit: refitted every :data:`REFIT_EVERY`, not per iteration."""

    def add(self, dag: IterationDag) -> None:
        """Every compute task of this iteration's DAG, with the fraction of it a collective of its rank overlapped."""
        t = dag.table
        if not len(t.comm_start) or not len(t.start):
            return
        frac = task_overlap(dag)
        dur = (t.end - t.start).astype(np.float64)
        keep = np.flatnonzero((t.cat == COMPUTE) & (dur > 0))
        if len(keep) > TASKS_PER_ITERATION:  # a big job: an even sample of its tasks, the same ones every iteration
            keep = keep[:: -(-len(keep) // TASKS_PER_ITERATION)]
        self._since += 1
        lanes = t.lane_of[keep]
        for e, lane, phase in zip(keep.tolist(), lanes.tolist(), t.phase[keep].tolist()):
            r = int(t.rank_idx[e])
            key = (dag.ranks[r], int(t.lane_code[lane]), phase, t.source[r].name[int(t.src[e])])
            block = self.blocks.get(key)
            if block is None:
                if len(self.blocks) >= MAX_BLOCKS:
                    continue
                block = self.blocks[key] = deque(maxlen=PER_BLOCK)
            block.append((float(frac[e]), float(dur[e])))

    def model(self) -> dict[str, Interference]:
        """Lane name → its fit, for the lanes whose blocks vary enough in overlap to fit one (refitted every
        :data:`REFIT_EVERY` iterations added)."""
        if self._since >= REFIT_EVERY:
            self._fitted, self._since = self._fit(), 0
        return dict(self._fitted)

    def _fit(self) -> dict[str, Interference]:
        by_lane: dict[int, list[tuple[F64, F64]]] = {}
        for (_, lane, _, _), block in self.blocks.items():
            if len(block) >= 3:
                arr = np.asarray(block)
                by_lane.setdefault(lane, []).append((arr[:, 0], arr[:, 1]))
        out = {}
        for lane, groups in by_lane.items():
            fit = fit_groups(groups)
            if fit is not None:
                k, se, n = fit
                out[LANES[lane]] = Interference(LANES[lane], k, se, n, len(groups))
        return out


def fit_groups(groups: list[tuple[F64, F64]]) -> tuple[float, float, int] | None:
    """(k, standard error, samples) of ``d = d₀ᵢ (1 + k f)`` over groups i of (overlap fractions, durations).

    Each group's durations are divided by their median, about ``d₀ᵢ (1 + k f̃ᵢ)`` (f̃ᵢ the median overlap); the
    normalised duration is then linear in ``f / (1 + k f̃ᵢ)`` with slope k, fitted within groups (centred). A few fixed-point passes settle k in the denominator;
    samples far out (by MAD) are dropped after the first. None when the overlap hardly varies within blocks.
    """
    f = np.concatenate([g[0] for g in groups])
    # Medians, not means: a few samples slowed by something else must not rescale their whole block.
    y = np.concatenate([g[1] / np.median(g[1]) for g in groups])
    fbar = np.concatenate([np.full(len(g[0]), np.median(g[0])) for g in groups])
    gid = np.concatenate([np.full(len(g[0]), i) for i, g in enumerate(groups)])
    keep = np.ones(len(f), dtype=bool)
    k = 0.0
    for _ in range(4):
        x = (f - fbar) / (1 + k * fbar)
        xk, yk = x[keep], y[keep] - 1.0
        # Re-centre within groups after dropping samples, so each block still counts only its own variation.
        xk = xk - _group_mean(xk, gid[keep], len(groups))
        yk = yk - _group_mean(yk, gid[keep], len(groups))
        sxx = float(xk @ xk)
        if sxx < MIN_SPREAD:
            return None
        k = float(xk @ yk) / sxx
        resid = yk - k * xk
        # Spread from the samples that carry information (blocks exactly repeated would make it 0), never below
        # a tenth of a percent of a block: the jitter of any clock and scheduler.
        told = resid[np.abs(xk) > 1e-6]
        mad = max(float(np.median(np.abs(told - np.median(told)))) if len(told) else 0.0, MIN_MAD)
        keep_now = np.zeros(len(f), dtype=bool)
        keep_now[np.flatnonzero(keep)[np.abs(resid) <= _OUTLIER_MADS * 1.4826 * mad]] = True
        keep = keep_now
    x = (f - fbar) / (1 + k * fbar)
    xk = x[keep] - _group_mean(x[keep], gid[keep], len(groups))
    yk = (y[keep] - 1.0) - _group_mean(y[keep] - 1.0, gid[keep], len(groups))
    sxx = float(xk @ xk)
    if sxx < MIN_SPREAD:
        return None
    k = float(xk @ yk) / sxx
    n = int(keep.sum())
    dof = max(n - len(groups) - 1, 1)
    se = float(np.sqrt(float(((yk - k * xk) ** 2).sum()) / dof / sxx))
    return k, se, n


def _group_mean(v: F64, gid: I64, groups: int) -> F64:
    total = np.bincount(gid, weights=v, minlength=groups)
    count = np.bincount(gid, minlength=groups)
    mean: F64 = (total / np.maximum(count, 1))[gid]
    return mean


def _covered(starts: I64, ends: I64) -> tuple[F64, F64]:
    """Breakpoints (times, covered ns up to each) of the union of intervals: ``np.interp`` gives coverage up to t."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order].astype(np.float64), ends[order].astype(np.float64)
    e = np.maximum.accumulate(np.maximum(e, s))
    # Merge: an interval starting before the running end continues the current union piece.
    new = np.concatenate(([True], s[1:] > e[:-1]))
    ps = s[new]
    pe = np.maximum.reduceat(e, np.flatnonzero(new))
    lengths = pe - ps
    before = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
    times = np.ravel(np.column_stack([ps, pe]))
    cover = np.ravel(np.column_stack([before, before + lengths]))
    return times, cover


def _coverage(times: F64, cover: F64, t: F64) -> F64:
    if not len(times):
        return np.zeros(len(t))
    out: F64 = np.interp(t, times, cover, left=0.0, right=float(cover[-1]))
    return out


def by_rank(rank_idx: I64, ranks: int) -> list[I64]:
    """The positions of each rank's entries (rank indices 0 … ranks − 1): one sort, not a scan per rank."""
    order = np.argsort(rank_idx, kind="stable")
    bounds = np.searchsorted(rank_idx[order], np.arange(ranks + 1))
    return [order[lo:hi] for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def task_overlap(dag: IterationDag) -> F64:
    """Per compute event of the table: the fraction of it during which a collective of its rank was in flight."""
    t = dag.table
    out = np.zeros(len(t.start))
    mine_by_rank, comm_by_rank = by_rank(t.rank_idx, len(dag.ranks)), by_rank(t.comm_rank_idx, len(dag.ranks))
    for mine, comm in zip(mine_by_rank, comm_by_rank):
        if not len(mine) or not len(comm):
            continue
        times, cover = _covered(t.comm_start[comm], t.comm_end[comm])
        s, e = t.start[mine].astype(np.float64), t.end[mine].astype(np.float64)
        span = e - s
        over = _coverage(times, cover, e) - _coverage(times, cover, s)
        out[mine] = np.where(span > 0, over / np.maximum(span, 1.0), 0.0)
    return out


def node_overlap(dag: IterationDag) -> F64:
    """Per node: the fraction of a run node's span during which a collective of its rank was in flight (0 else)."""
    t = dag.table
    out = np.zeros(dag.nodes)
    runs = np.flatnonzero(dag.kind == RUN)
    run_rank = np.searchsorted(np.array(dag.ranks, dtype=np.int64), dag.rank_of[runs])  # rank → its index
    comm_by_rank = by_rank(t.comm_rank_idx, len(dag.ranks))
    for comm, nodes in zip(comm_by_rank, (runs[group] for group in by_rank(run_rank, len(dag.ranks)))):
        if not len(comm) or not len(nodes):
            continue
        times, cover = _covered(t.comm_start[comm], t.comm_end[comm])
        a, b = dag.a[nodes].astype(np.float64), dag.b[nodes].astype(np.float64)
        over = _coverage(times, cover, b) - _coverage(times, cover, a)
        out[nodes] = np.where(b > a, over / np.maximum(b - a, 1.0), 0.0)
    return out


def compute_factors(dag: IterationDag, overlap: F64, k_by_lane: dict[str, float], rho: float) -> F64:
    """Per node: the multiplier of its compute time when every collective takes ρ times as long.

    Args:
        overlap: :func:`node_overlap` of the DAG.
        k_by_lane: lane name → the interference factor to apply (lanes not named: none).
        rho: the collectives' new time over their observed time (0: free, 0.5: half, 2: double).
    """
    k = np.zeros(dag.nodes)
    lanes = dag.lane_of >= 0
    codes = np.full(dag.nodes, -1)
    codes[lanes] = dag.table.lane_code[dag.lane_of[lanes]]
    for name, value in k_by_lane.items():
        k[codes == LANES.index(name)] = max(value, 0.0)
    new = np.minimum(rho * overlap, 1.0)
    factors: F64 = (1 + k * new) / (1 + k * overlap)
    return factors
