"""What-if scenarios replayed on the DAG, and the α-β ring all-reduce model fitted to the observed collectives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dagtop.model.change import Change
from dagtop.model.dag import ALLREDUCE, IterationDag
from dagtop.model.interference import COMPUTE, compute_factors, node_overlap
from dagtop.model.replay import durations, replay
from dagtop.model.snapshot import AlphaBeta, Segment, Straggler, WhatIf
from dagtop.model.table import F64
from instrument.events import CATEGORIES, CATEGORY_CODE

_MAX_SIZES = 64


@dataclass(slots=True)
class CommFit:
    """Running least-squares fit of collective duration against bytes, for one worker count."""

    workers: int = 0
    n: int = 0
    sm: float = 0.0
    st: float = 0.0
    smm: float = 0.0
    smt: float = 0.0
    stt: float = 0.0
    sizes: set[int] = field(default_factory=set)

    def add(self, workers: int, nbytes: int, seconds: float) -> None:
        if workers != self.workers:  # a different job size: the old fit no longer applies
            self.workers, self.n, self.sm, self.st, self.smm, self.smt, self.stt = workers, 0, 0.0, 0.0, 0.0, 0.0, 0.0
            self.sizes = set()
        m = float(nbytes)
        self.n += 1
        self.sm += m
        self.st += seconds
        self.smm += m * m
        self.smt += m * seconds
        self.stt += seconds * seconds
        if len(self.sizes) < _MAX_SIZES:
            self.sizes.add(nbytes)

    def model(self) -> AlphaBeta | None:
        """α and β with β's standard error, or None when nothing can be fitted (no collectives, one worker, no
        bytes).

        With one bucket size the intercept cannot be told from the slope: the line goes through the origin
        (α = 0, all cost per byte). A negative intercept or slope is clamped to 0 and the other refitted. The
        standard error is the ordinary least-squares one of the line fitted, from its residuals.
        """
        p = self.workers
        if p <= 1 or self.n == 0 or self.sm <= 0:
            return None
        slope: float
        intercept: float
        n = self.n
        var = n * self.smm - self.sm * self.sm
        free = 1  # parameters fitted: the slope, and the intercept where it is not held at 0
        if len(self.sizes) >= 2 and var > 0:
            slope = (n * self.smt - self.sm * self.st) / var
            intercept = (self.st - slope * self.sm) / n
            free = 2
            if intercept < 0:
                intercept, slope, free = 0.0, self.smt / self.smm, 1
            elif slope < 0:
                intercept, slope = self.st / n, 0.0
        else:
            intercept, slope = 0.0, self.smt / self.smm
        slope = max(slope, 0.0)
        # Σ (t − a − b m)², expanded over the running sums; rounding can leave it a hair below 0.
        sse = (self.stt - 2 * intercept * self.st - 2 * slope * self.smt + n * intercept * intercept
               + 2 * intercept * slope * self.sm + slope * slope * self.smm)
        spread = self.smm - (self.sm * self.sm / n if free == 2 else 0.0)  # Σ (m − m̄)², or Σ m² through 0
        se = (max(sse, 0.0) / (n - free) / spread) ** 0.5 if n > free and spread > 0 else 0.0
        per_beta = p / (2 * (p - 1))
        return AlphaBeta(intercept / (2 * (p - 1)), slope * per_beta, se * per_beta, n, len(self.sizes))


@dataclass(frozen=True, slots=True)
class Scenario:
    """One change: category multipliers per rank (and for the collectives), optional collective durations."""

    change: Change
    scale: F64
    collective_ns: dict[int, float] | None = None
    comm_ratio: float | None = None
    """The collectives' time with the change over their time now, for the changes that add or remove overlap:
    the compute they overlapped is rescaled by the fitted interference (:mod:`dagtop.model.interference`)."""
    bound: int = 0
    """0: the prediction; −1 and +1: the same change with the fitted β one standard error down and up (folded
    into the prediction's ``bounds_ms`` by :func:`what_ifs`)."""
    bandwidth_gbps: float | None = None


def scenarios(
    dag: IterationDag, straggler: Straggler | None, comm: AlphaBeta | None, busy: dict[int, F64],
    bandwidth_gbps: float | None = None,
) -> list[Scenario]:
    """The changes the model answers for this iteration. The identity (the iteration as measured) is not among
    them: the analysis replays it first, alone, since the straggler change needs its critical path.

    Args:
        bandwidth_gbps: the bus bandwidth of ``network bandwidth``, GB/s; None: twice the fitted one.
    """
    rows = len(dag.ranks) + 1
    one = np.ones((rows, len(CATEGORIES)))

    def scaled(row: int | slice, category: int, factor: float) -> F64:
        s: F64 = one.copy()
        s[row, category] = factor
        return s

    out = []
    if dag.collectives:  # with none timed, a change to communication would read ×1.00: a claim about nothing
        out += [
            Scenario(Change.ALLREDUCE_HALF, scaled(slice(None), ALLREDUCE, 0.5), comm_ratio=0.5),
            Scenario(Change.ALLREDUCE_DOUBLE, scaled(slice(None), ALLREDUCE, 2.0), comm_ratio=2.0),
            Scenario(Change.PERFECT_OVERLAP, scaled(rows - 1, ALLREDUCE, 0.0), comm_ratio=0.0),
        ]
    out.append(Scenario(Change.IO_HIDDEN, scaled(slice(None), CATEGORY_CODE["io"], 0.0)))
    if straggler is not None and straggler.category in CATEGORY_CODE:
        c = CATEGORY_CODE[straggler.category]
        own = busy[straggler.rank][c]
        if own > 0:
            target = max(own - straggler.excess_ms * 1e6, 0.0)
            out.append(Scenario(Change.STRAGGLER_AT_MEDIAN, scaled(dag.ranks.index(straggler.rank), c, target / own)))
    p = len(dag.ranks)
    if comm is None or p <= 1 or not dag.collectives:
        return out
    observed = {c.node: float(dag.catsum[c.node, ALLREDUCE]) for c in dag.collectives}
    now = sum(observed.values())
    per_byte = 2 * (p - 1) / p  # of the ring: the bytes each rank sends per byte reduced
    beta = comm.beta_s_per_byte
    target_gbps = bandwidth_gbps if bandwidth_gbps is not None else 2 * comm.bus_gbps
    bounds = (0, -1, 1) if comm.beta_se > 0 else (0,)

    def fitted(change: Change, new: dict[int, float], bound: int) -> Scenario:
        new = {v: max(ns, 0.0) for v, ns in new.items()}
        ratio = sum(new.values()) / now if now > 0 else None
        return Scenario(change, one, new, ratio, bound, target_gbps if change is Change.NETWORK else None)

    for bound in bounds:
        b = beta + bound * comm.beta_se
        out.append(fitted(Change.DOUBLE_WORKERS, {c.node: observed[c.node] + (comm.seconds(2 * p, c.bytes, b)
                                                                             - comm.seconds(p, c.bytes, b)) * 1e9
                                                  for c in dag.collectives}, bound))
        if beta > 0 and 0 < target_gbps < float("inf"):
            # The per-byte part of each collective, as the fit apportions it, redone at the target bandwidth.
            out.append(fitted(Change.NETWORK, {c.node: observed[c.node] + per_byte * c.bytes * (1e-9 / target_gbps - b)
                                               * 1e9 for c in dag.collectives}, bound))
    return out


def run_scenarios(dag: IterationDag, cases: list[Scenario], origin_ns: int, busy: dict[int, F64],
                  interference: Mapping[str, float] | None = None) -> list[float]:
    """Predicted iteration ms for each scenario, all replayed at once.

    With ``interference`` (lane → fitted factor k), a change to the collectives' time also rescales the compute
    that overlapped them: compute no longer shares the machine with communication that is gone.

    'perfect overlap' is the replay with every collective free: the most that overlapping communication
    can buy (when the collectives outlast the backward pass no real overlap gets there; 'all-reduce ×0.5'
    is the realistic figure then). 'I/O hidden' is the replay with loading free, but never faster than
    the loader itself: one batch per iteration on the slowest-loading rank.
    """
    dur = durations(dag, np.stack([c.scale for c in cases]))
    for i, case in enumerate(cases):
        if case.collective_ns:
            nodes = np.fromiter(case.collective_ns.keys(), dtype=np.int64)
            dur[i, nodes] = np.fromiter(case.collective_ns.values(), dtype=np.float64)
    if interference and any(v > 0 for v in interference.values()):
        overlap = node_overlap(dag)
        compute = dag.catsum[:, COMPUTE]
        for i, case in enumerate(cases):
            if case.comm_ratio is not None:
                factors = compute_factors(dag, overlap, dict(interference), case.comm_ratio)
                dur[i] += compute * (factors - 1.0)
    _, end = replay(dag, dur)
    out = [(float(f) - origin_ns) / 1e6 for f in end.max(axis=1)]
    for i, case in enumerate(cases):
        if case.change is Change.IO_HIDDEN and busy:
            loader = max(float(b[CATEGORY_CODE["io"]]) for b in busy.values())
            out[i] = max(out[i], loader / 1e6)
    return out


def what_ifs(base_ms: float, cases: list[Scenario], predicted_ms: list[float]) -> tuple[WhatIf, ...]:
    """WhatIf entries for every change; speedup = ``base_ms`` (the identity replay) / scenario. The bound
    scenarios of a change become its ``bounds_ms`` (the lower iteration time first)."""
    bounds: dict[Change, list[float]] = {}
    for c, ms in zip(cases, predicted_ms):
        if c.bound:
            bounds.setdefault(c.change, []).append(ms)
    return tuple(WhatIf(c.change, ms, base_ms / ms if ms > 0 else float("inf"),
                        (min(bounds[c.change]), max(bounds[c.change])) if c.change in bounds else None,
                        c.bandwidth_gbps)
                 for c, ms in zip(cases, predicted_ms) if not c.bound)


SHI_TERMS = {("io", "load"): "t_io", ("pcie", "h2d"): "t_h2d", ("compute", "forward"): "t_f",
             ("compute", "backward"): "t_b", ("allreduce", "allreduce"): "t_c", ("compute", "update"): "t_u"}
"""(category, phase) on the critical path → the term of Shi et al.'s t_iter = t_io + t_h2d + t_f + t_b + t_c + t_u."""


def decomposition(path: Sequence[Segment]) -> dict[str, float]:
    """One iteration in the terms of Shi et al. (arXiv 1805.03812), ms, from its critical path: each term is the
    time that stage holds the path, so t_c is the exposed communication and t_io, t_h2d count only what was not
    prefetched. ``t_other`` holds the rest (untimed host work, other phases); the terms sum to the iteration."""
    out = dict.fromkeys((*SHI_TERMS.values(), "t_other"), 0.0)
    for s in path:
        out[SHI_TERMS.get((s.category, s.phase), "t_other")] += s.duration_ms
    return out
