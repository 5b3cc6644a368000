"""What-if scenarios replayed on the DAG, and the α-β ring all-reduce model fitted to the observed collectives."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dagtop.model.change import Change
from dagtop.model.dag import ALLREDUCE, IterationDag
from dagtop.model.interference import COMPUTE, compute_factors, node_overlap
from dagtop.model.replay import durations, replay
from dagtop.model.snapshot import AlphaBeta, Collective, Interference, Segment, WhatIf
from dagtop.model.table import F64
from instrument.events import CATEGORIES, CATEGORY_CODE

_MAX_SIZES = 64


@dataclass(slots=True)
class CommFit:
    """Running least-squares fit of the ring model to the collectives seen, for one worker count.

    Each sample is a transfer: one collective, or several that were in flight together (:func:`transfers`), and
    costs ``t = k·a + M·b`` for its k collectives of M bytes in all, ``a = 2(P−1)α`` and ``b = 2(P−1)/P·β``. One
    collective alone (k = 1) is the usual line ``t = a + b·M``.
    """

    workers: int = 0
    n: int = 0
    skk: float = 0.0
    skm: float = 0.0
    smm: float = 0.0
    skt: float = 0.0
    smt: float = 0.0
    stt: float = 0.0
    collectives: int = 0
    sizes: set[int] = field(default_factory=set)

    def add(self, workers: int, nbytes: int, seconds: float, count: int = 1) -> None:
        """One transfer: ``count`` collectives of ``nbytes`` bytes in all, over ``seconds``."""
        if workers != self.workers:  # a different job size: the old fit no longer applies
            self.workers, self.n, self.collectives, self.sizes = workers, 0, 0, set()
            self.skk = self.skm = self.smm = self.skt = self.smt = self.stt = 0.0
        k, m = float(count), float(nbytes)
        self.n += 1
        self.collectives += count
        self.skk += k * k
        self.skm += k * m
        self.smm += m * m
        self.skt += k * seconds
        self.smt += m * seconds
        self.stt += seconds * seconds
        if len(self.sizes) < _MAX_SIZES:
            self.sizes.add(nbytes)

    def model(self) -> AlphaBeta | None:
        """α and β with β's standard error, or None when nothing can be fitted (no collectives, one worker, no
        bytes).

        Where every transfer has the same bytes per collective, the latency cannot be told from the per-byte cost:
        the fit goes through the origin (α = 0, all cost per byte, ``alpha_known`` False). A negative α or β is
        clamped to 0 and the other refitted. The standard error is the ordinary least-squares one of the fit, from
        its residuals.
        """
        p, n = self.workers, self.n
        if p <= 1 or n == 0 or self.smm <= 0:
            return None
        det = self.skk * self.smm - self.skm * self.skm
        a, b = 0.0, self.smt / self.smm
        var_b = 1.0 / self.smm  # of b, per unit of residual variance: through the origin
        free = 1  # parameters fitted
        if det > 1e-9 * self.skk * self.smm:  # some transfers differ in bytes per collective
            a = (self.smm * self.skt - self.skm * self.smt) / det
            b = (self.skk * self.smt - self.skm * self.skt) / det
            var_b, free = self.skk / det, 2
            if a < 0:
                a, b, var_b, free = 0.0, self.smt / self.smm, 1.0 / self.smm, 1
            elif b < 0:
                a, b = self.skt / self.skk, 0.0
        b = max(b, 0.0)
        # Σ (t − k a − M b)², expanded over the running sums; rounding can leave it a hair below 0.
        sse = (self.stt - 2 * a * self.skt - 2 * b * self.smt + a * a * self.skk + 2 * a * b * self.skm
               + b * b * self.smm)
        se = (max(sse, 0.0) / (n - free) * var_b) ** 0.5 if n > free else 0.0
        per_beta = p / (2 * (p - 1))
        return AlphaBeta(a / (2 * (p - 1)), b * per_beta, se * per_beta, self.collectives, len(self.sizes),
                         alpha_known=det > 1e-9 * self.skk * self.smm)


def transfers(collectives: Sequence[Collective]) -> list[tuple[int, int, float]]:
    """The iteration's collectives as the network carried them: (collectives, bytes, seconds) per transfer.

    The model runs a rank's collectives one at a time, each from its latest ready time or the previous one's end.
    A collective every rank had issued before the previous one ended was in flight with it, on gloo's threads
    at once or queued behind it: how the time between them was shared is not observed, only their sum. Such runs
    are one transfer, from the first one's start to the last one's end; a collective issued after the previous
    ended (a GPU stream's kernels, a backward slower than the network) stands alone.
    """
    out: list[tuple[int, int, float]] = []
    count, nbytes, start, end = 0, 0, 0, 0
    for c in sorted(collectives, key=lambda c: c.start_ns):
        if count and max(c.ready_ns.values()) < end:
            count, nbytes, end = count + 1, nbytes + c.bytes, max(end, c.end_ns)
            continue
        if count:
            out.append((count, nbytes, (end - start) / 1e9))
        count, nbytes, start, end = 1, c.bytes, c.start_ns, c.end_ns
    if count:
        out.append((count, nbytes, (end - start) / 1e9))
    return out


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
    rank: int | None = None
    """``straggler at median``: the rank it brings to the median."""
    unpredictable: str = ""
    """Why the change cannot be predicted on this job (its replay, if any, is not shown); empty when it can."""
    lower_bound: str = ""
    """Why the predicted gain is only a lower bound on this job; empty when it is not."""


def scenarios(
    dag: IterationDag, suspect: tuple[int, str] | None, comm: AlphaBeta | None, busy: dict[int, F64],
    bandwidth_gbps: float | None = None, cohosts: Mapping[int, CoHost] | None = None,
) -> list[Scenario]:
    """The changes the model answers for this iteration. The identity (the iteration as measured) is not among
    them: the analysis replays it first, alone.

    Args:
        suspect: (rank, category) of the steady verdict's straggler: 'straggler at median' brings that rank's time
            in that category down to the other ranks' median in this iteration (never up); None: not replayed.
        bandwidth_gbps: the bus bandwidth of ``network bandwidth``, GB/s; None: twice the fitted one.
        cohosts: the CPU ranks that share their host's cores with other ranks of the job (:func:`cohosts`): a
            compute straggler among them gets a 'straggler at median' that is a lower bound
            (:func:`shared_cores`), and 'perfect overlap' is one wherever there are any
            (:func:`comm_on_shared_cores`).
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
            Scenario(Change.PERFECT_OVERLAP, scaled(rows - 1, ALLREDUCE, 0.0), comm_ratio=0.0,
                     lower_bound=comm_on_shared_cores(cohosts) if cohosts else ""),
        ]
    out.append(Scenario(Change.IO_HIDDEN, scaled(slice(None), CATEGORY_CODE["io"], 0.0)))
    if suspect is not None and suspect[0] in busy and suspect[1] in CATEGORY_CODE and len(busy) > 1:
        rank, c = suspect[0], CATEGORY_CODE[suspect[1]]
        own = float(busy[rank][c])
        others = float(np.median([float(b[c]) for r, b in busy.items() if r != rank]))
        if own > 0:
            shared = (cohosts or {}).get(rank) if suspect[1] == "compute" else None
            out.append(Scenario(Change.STRAGGLER_AT_MEDIAN, scaled(dag.ranks.index(rank), c, min(others, own) / own),
                                rank=rank, lower_bound=shared_cores(rank, shared) if shared else ""))
    p = len(dag.ranks)
    if comm is None or p <= 1 or not dag.collectives:
        return out
    observed = {c.node: float(dag.catsum[c.node, ALLREDUCE]) for c in dag.collectives}
    now = sum(observed.values())
    beta = comm.beta_s_per_byte
    target_gbps = bandwidth_gbps if bandwidth_gbps is not None else 2 * comm.bus_gbps
    unknown = beta_unknown(comm)
    if unknown:
        out += [Scenario(Change.DOUBLE_WORKERS, one, unpredictable=unknown),
                Scenario(Change.NETWORK, one, bandwidth_gbps=bandwidth_gbps, unpredictable=unknown)]
        return out
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
        if 0 < target_gbps < float("inf"):
            out.append(fitted(Change.NETWORK, {c.node: at_bandwidth(observed[c.node], c.bytes, p, b, 1e-9 / target_gbps)
                                               for c in dag.collectives}, bound))
    return out


@dataclass(frozen=True, slots=True)
class CoHost:
    """A CPU rank's host and the other ranks of the job computing on its cores."""

    host: str
    others: tuple[int, ...]


def cohosts(ranks: Mapping[int, tuple[str, str]]) -> dict[int, CoHost]:
    """Rank → its host and the other ranks on it, for each rank computing on the CPU (``device`` ``cpu``) whose
    host runs another rank of the job; ``ranks``: rank → (host, device), as the hellos say. GPU ranks are left
    out: what slows one GPU's compute does not take it from its neighbours."""
    by_host: dict[str, list[int]] = {}
    for rank, (host, _) in ranks.items():
        by_host.setdefault(host, []).append(rank)
    return {rank: CoHost(host, tuple(sorted(r for r in by_host[host] if r != rank)))
            for rank, (host, device) in ranks.items() if device == "cpu" and len(by_host[host]) > 1}


def shared_cores(rank: int, shared: CoHost) -> str:
    """Why 'straggler at median' is a lower bound for a compute straggler that shares its cores with other ranks.

    The replay brings the straggler's compute to the others' median and keeps everything else as measured. What
    slows a CPU rank's compute on a shared host (another process, more threads than cores) also takes CPU from the
    ranks and the communication threads beside it: taking it away speeds them up as well. Measured on a 2-core
    host (2 and 4 gloo ranks, a CPU hog started by one rank, switched off and on in the same job;
    benchmarks/verdict_accuracy.py, three campaigns): the replay's gain was below the real one in all 18 runs, by
    5–28 %."""
    others = ", ".join(map(str, shared.others))
    return (f"rank {rank} computes on the cores of host {shared.host} with rank"
            f"{'s' if len(shared.others) > 1 else ''} {others}; what slows it there takes CPU from them too, and "
            "removing it speeds them up as well, which the replay does not count")


def waits_on_shared_cores(rank: int, shared: CoHost) -> str:
    """Why 'straggler at median' is in doubt for a loader straggler that shares its cores with other ranks.

    While it waits for its data, the ranks beside it compute with the CPU it leaves; brought to the median, it
    computes at the same time as they do and slows them, which the replay, holding their compute as measured, does
    not count. How much, and even which way the figure errs, depends on what the loader does while it is waited for
    (sleeps on a disk, or decodes on these very cores), which the timings do not say. Measured on a 2-core host
    with another busy process (2 gloo ranks, one loader sleeping 40 ms a step, switched off and on in the same job;
    benchmarks/verdict_accuracy.py): the replay said ×1.60–1.72 where switching the sleep off gained ×1.10–1.22
    (4 of 4 runs); in an earlier campaign ×1.31 and ×1.45 against ×1.44 and ×1.39; with 4 ranks −5 % and +12 %."""
    others = ", ".join(map(str, shared.others))
    many = len(shared.others) > 1
    return (f"rank {rank} waits for its data on the cores of host {shared.host}, where rank{'s' if many else ''} "
            f"{others} compute{'' if many else 's'} meanwhile; at the median it would compute beside "
            f"{'them' if many else 'it'} and slow {'them' if many else 'it'}, which the replay does not count (a "
            "40-ms loader sleep on 2 shared cores: "
            "×1.60–1.72 replayed, ×1.10–1.22 re-run)")


def comm_on_shared_cores(shared: Mapping[int, CoHost]) -> str:
    """Why 'perfect overlap' is likely a lower bound where CPU ranks share a host.

    Measured inside one job (benchmarks/verdict_accuracy.py --overlap: one 40 MB bucket, all-reduced only after the
    whole backward, 2 gloo ranks on 2 shared cores, blocks of steps with and without communication interleaved):
    the job's compute (forward, backward, optimizer step, by its own clock) ran 4–22 % slower in the steps with
    communication than in the steps without, though never at the same time as the all-reduce; the replay holds
    compute as measured, so its figure was 3–18 % below the gain of no communication (6 runs of 8 pairs of blocks,
    load 14–16). The job's own iterations cannot show it (every one communicates), so the model cannot fit it as
    it fits the interference of compute under a collective."""
    hosts = ", ".join(sorted({c.host for c in shared.values()}))
    return (f"the ranks on host{'s' if ',' in hosts else ''} {hosts} compute on cores that gloo's threads share, "
            "and there compute ran slower in steps with communication than in steps without even "
            "where the two did not overlap, which the replay holds as measured (one 40 MB bucket on 2 shared cores: "
            "this figure was 3–18 % below the gain of no communication in 6 of 6 runs)")


ODD_SPEED_UP = 0.2
"""How much faster compute must run under collectives (−k) before the fit is taken for something else at work. A fit
of k = −0.10 ± 0.01 came from an MLP of 18 layers (DDP's default buckets) on 2 CPU ranks whose blocks ran, by the
median of each block's runs with and without a collective in flight, 3 % faster (quartiles −7 % and 0 %): within
what the fit's own confounds make of noise. It then applies no interference (k is floored at 0)."""


def unexplained(fitted: Sequence[Interference]) -> str:
    """Why the changes to communication cannot be predicted (empty when they can): a lane whose compute ran faster
    while a collective was in flight, by more than two standard errors and by more than :data:`ODD_SPEED_UP`. The
    model knows why communication slows compute (they share the cores); compute sped up by it is something else at
    work (a clock boost, a cache, a measurement artefact), and replaying the change on top of it would be a number
    with nothing behind it."""
    odd = [f for f in fitted if f.factor + 2 * f.stderr < 0 and f.factor < -ODD_SPEED_UP]
    if not odd:
        return ""
    said = ", ".join(f"{f.lane} ×{1 + f.factor:.2f} ± {f.stderr:.2f}" for f in odd)
    return f"compute ran faster while a collective was in flight ({said}), which the model cannot explain"


def beta_unknown(comm: AlphaBeta) -> str:
    """Why the fit's per-byte cost β cannot carry a prediction (empty when it can): fewer than three collectives,
    β fitted as 0 (the time does not grow with the bytes), or its standard error over half of it."""
    if comm.samples < 3:
        return f"the network's per-byte cost β is not identified yet ({comm.samples} collectives timed)"
    if comm.beta_s_per_byte <= 0:
        return (f"the network's per-byte cost β is not identified: the collectives' time does not grow with their "
                f"bytes ({comm.samples} collectives, {comm.sizes} sizes)")
    if comm.beta_se > comm.beta_s_per_byte / 2:
        return (f"the network's per-byte cost β is not identified: {comm.bus_gbps:.3g} GB/s fitted, ± "
                f"{comm.beta_se / comm.beta_s_per_byte * 100:.0f} % at one standard error")
    return ""


def at_bandwidth(observed_ns: float, nbytes: int, workers: int, beta: float, target_beta: float) -> float:
    """One collective's ns with the network's per-byte cost ``target_beta`` (s/B) in place of ``beta``: the one
    bandwidth model behind 'network bandwidth' and 'all-reduce ×F'.

    The observed time is split into its per-byte part 2(P−1)/P · M · β, never more than the time observed (the
    fit is over many collectives: it may give one more than it took), and the rest (latency, and what the fit does
    not explain); only the per-byte part is redone. So twice the bandwidth never does more than 'all-reduce ×0.5',
    which halves the whole.
    """
    per_byte = min(observed_ns, 2 * (workers - 1) / workers * nbytes * beta * 1e9)
    return observed_ns - per_byte + per_byte * (target_beta / beta if beta > 0 else 1.0)


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
    out = []
    for c, ms in zip(cases, predicted_ms):
        if c.bound:
            continue
        if c.unpredictable:
            out.append(WhatIf(c.change, math.nan, math.nan, None, c.bandwidth_gbps, c.rank, c.unpredictable))
            continue
        # The point within its bounds: the same change with β moved by one standard error either way.
        within = (min(ms, *bounds[c.change]), max(ms, *bounds[c.change])) if c.change in bounds else None
        out.append(WhatIf(c.change, ms, base_ms / ms if ms > 0 else float("inf"), within, c.bandwidth_gbps, c.rank,
                          lower_bound=c.lower_bound))
    return tuple(out)


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
