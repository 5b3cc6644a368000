"""Gradient buckets regrouped: the wait-free backpropagation schedule of their all-reduces, and MG-WFBP's merge rule
(Shi et al., INFOCOM'19) on the job's own α-β fit and backward times; the buckets themselves, as DDP makes them, are
:mod:`dagtop.model.bucket_map`'s.

A bucket is handed to the process group when its last gradient is ready and the bucket before it was handed over;
the all-reduces run one after another, each costing ``t(M) = 2(P−1)α + 2(P−1)/P·M·β``. With per-block backward
times this gives when the last all-reduce ends for any grouping: a grouping's cost is how much later than the
backward that is (Shi et al.'s exposed communication, ``tc_start[1] + t_c[1] − (tb_start[1] + t_b[1])``).

The all-reduce's cost is fitted on the job's own buckets with the stretch compute puts on it
(:mod:`dagtop.model.allreduce`). A prediction is a difference of two such schedules on the same iteration (the
buckets now, the buckets changed), taken off the iteration's replayed time: what the schedule does not model
(compute, the update, the ranks' waits) is in both and cancels. The schedule of the buckets now is checked against
the collectives observed (:attr:`BucketModel.error`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dagtop.model.allreduce import KAPPAS, AllReduce
from dagtop.model.bucket_map import DEFAULT_LIMITS, MIB, Backward, Layout, totals

CAPS_MB = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 32, 50, 64, 100, 128, 256, 512)
"""The uniform ``bucket_cap_mb`` values tried."""
REACH = 2.0
"""How far above the largest bucket all-reduced a grouping's buckets may reach and be predicted. Past a cache's
size a byte costs more: on the 2-core test machine (1 MiB of L2 a core) gloo's all-reduces from 1 to 8 MiB took
0.55-0.57 ns a byte where those from 16 KiB to 1 MiB read 0.33-0.36 (benchmarks/allreduce_sizes.py), and NCCL's
bus bandwidth climbs with the size; DDP's default buckets predicted from buckets a tenth their size over-shot their
re-runs by 7.8 to 30.5 % in 4 of 4 (benchmarks/validate_advice.py, 41 small layers)."""



def finish_ns(layout: Layout, counts: Sequence[int], b: Backward, comm: AllReduce,
              sizes: Sequence[int] | None = None, per_byte: float | None = None, launch_ns: float = 0.0,
              steal: float = 0.0) -> float:
    """When the backward and the last all-reduce are both over, for the grouping ``counts`` of ``layout``: each
    bucket is handed over when its last gradient is ready and the one before it was, and all-reduced once the one
    before it is done, stretched while the backward runs. ``sizes``: the parameters' bytes as sent (default: as
    they are; halved for a 16-bit hook); ``per_byte`` in place of the fitted one. ``launch_ns``: what handing one
    bucket over takes the backward's thread (DDP's call into the process group; CPU ranks): with fewer buckets
    than now before it, a gradient is ready that much earlier for each launch fewer, and the backward ends so.
    ``steal``: what each ns of all-reduce work beside the backward takes from it (gloo's threads on the cores of a
    CPU rank with none to spare; :func:`steal_of`): the backward, as recorded beside the buckets now, is
    lengthened (shortened) evenly by that much of the work a grouping runs beside it more (less) than they do."""
    params = layout.ready_ns(b)
    end = float(b.end)
    if tuple(counts) != layout.now:
        if launch_ns:
            params = params - launch_ns * (_launched_before(layout.now, len(params))
                                           - _launched_before(counts, len(params)))
            end -= launch_ns * (len(layout.now) - len(counts))
        if steal:
            lost = steal * (_schedule(layout, counts, params, end, comm, sizes, per_byte)[1]
                            - _schedule(layout, layout.now, layout.ready_ns(b), float(b.end), comm, sizes, per_byte)[1])
            first = float(params.min())
            scale = max(1 + lost / (end - first), 0.0) if end > first else 1.0
            params, end = first + (params - first) * scale, first + (end - first) * scale
    return _schedule(layout, counts, params, end, comm, sizes, per_byte)[0]


def _schedule(layout: Layout, counts: Sequence[int], params: npt.NDArray[np.float64], end: float, comm: AllReduce,
              sizes: Sequence[int] | None, per_byte: float | None) -> tuple[float, float]:
    """:func:`finish_ns`'s schedule of the grouping ``counts`` with each parameter's gradient ready at ``params`` and
    the backward over at ``end``: when the backward and the last all-reduce are both over, and how much of the
    all-reduces' work (as long as it takes alone) ran beside the backward."""
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    ready = np.maximum.accumulate(np.maximum.reduceat(params, starts)).tolist()
    sent = np.add.reduceat(np.asarray(layout.sizes if sizes is None else sizes, dtype=np.float64), starts).tolist()
    channel, beside = float("-inf"), 0.0
    for handed, nbytes in zip(ready, sent):  # each bucket after the one before it: one at a time, in order
        start, work = max(channel, handed), comm.work(nbytes, per_byte)
        channel = comm.finish(start, work, end)
        if start < end:
            beside += min(work, (end - start) / (1 + comm.kappa))
    return max(channel, end), beside


def steal_of(layout: Layout, comm: AllReduce, others_ms: float, cores_per_rank: int | None) -> float:
    """What each ns of all-reduce work beside the backward takes from it on a CPU rank: gloo's threads reduce on
    the rank's cores, and where a rank has no core to spare beside its training thread (``cores_per_rank`` under
    2) they take it from the backward. The share is the CPU time those threads spent a step (``others_ms``: the
    process's beside the training thread, :attr:`~instrument.wire.ThreadCpu.others_ns`) over the work the fitted
    α-β model gives the buckets now, at most 1; 0 with a core to spare, unknown cores or no CPU times (GPU ranks).
    What a regrouping changes that CPU time by, measured without dagtop (benchmarks/gloo_cpu.py), can be less than
    this share: 0.47 ms per ms of work on an MLP whose recordings read 0.68. Torch's intra-op threads count in that
    CPU time too: a rank that computes on several threads over-states it (torchrun runs one a rank by default).

    >>> steal_of(Layout(("a", "b"), (4, 4), ("a", "b"), (1, 1)), AllReduce(1e6, 0.0, 0.0, 2), 1.0, 1)
    0.5
    """
    if not others_ms or cores_per_rank is None or cores_per_rank >= 2:
        return 0.0
    work = sum(comm.work(n) for n in totals(layout.sizes, layout.now))
    return min(others_ms * 1e6 / work, 1.0) if work > 0 else 0.0


def _launched_before(counts: Sequence[int], n: int) -> npt.NDArray[np.float64]:
    """Per parameter, how many buckets of the grouping ``counts`` were handed over before its gradient was ready:
    those whose last parameter comes before it.

    >>> _launched_before([2, 3], 5).tolist()
    [0.0, 0.0, 1.0, 1.0, 1.0]
    """
    return np.searchsorted(np.cumsum(counts) - 1, np.arange(n), side="left").astype(np.float64)


def mg_wfbp(layout: Layout, b: Backward, comm: AllReduce) -> tuple[int, ...]:
    """MG-WFBP's grouping (Shi et al., INFOCOM'19) of one backward: walking the gradients in the order they become
    ready, the next block's gradients join the group before them when that group's all-reduce could not start
    before they are ready anyway (the channel is busy), or when the wait for them is shorter than the start-up
    cost ``2(P−1)α`` a merge saves; else they start a group of their own. Returns parameters per group."""
    latency = comm.a_ns
    layers: list[tuple[float, int, int]] = []  # (ready, bytes, parameters) per run of one block's parameters
    for i, (blk, size) in enumerate(zip(layout.blocks, layout.sizes)):
        if i and blk and layout.blocks[i - 1] == blk:
            r, m, n = layers[-1]
            layers[-1] = (r, m + size, n + 1)
        else:
            layers.append((float(b.ready.get(blk, b.end) if blk else b.end), size, 1))
    groups: list[list[float]] = []  # [ready, bytes, parameters]
    before = float("-inf")  # when the all-reduces of the groups before the last one end
    for ready, size, n in layers:
        if groups:
            g = groups[-1]
            start = max(g[0], before)
            end = comm.finish(start, comm.work(g[1]), b.end)
            if ready < end and (start > ready or ready - start < latency):
                g[0], g[1], g[2] = max(g[0], ready), g[1] + size, g[2] + n
                continue
            before = end
        groups.append([ready, float(size), float(n)])
    return tuple(int(g[2]) for g in groups)


def limits_for(layout: Layout, counts: Sequence[int]) -> tuple[float, ...] | None:
    """``bucket_cap_mb_list`` (MiB, rounded down to 4 decimals) that makes DDP build exactly ``counts``; None if
    no such rounding does (a parameter of under ~100 bytes closing a group)."""
    sizes = totals(layout.sizes, counts)
    caps = tuple(int(s / MIB * 1e4) / 1e4 for s in sizes)
    return caps if layout.counts([int(c * MIB) for c in caps]) == tuple(counts) else None


@dataclass(frozen=True, slots=True)
class Grouping:
    """One way to bucket the gradients, with what it predicts."""

    label: str
    """How a user gets it: ``bucket_cap_mb=100``, ``bucket_cap_mb_list=[…]``, ``DDP's default``."""
    setting: Mapping[str, object]
    """The DistributedDataParallel keyword arguments that make it ({} for the default)."""
    counts: tuple[int, ...]
    step_ms: tuple[float, ...]
    """Predicted iteration ms on each iteration read (its replayed time less what the schedule saves)."""
    bounds_ms: tuple[float, float]
    """The median prediction with the per-byte time one standard error down and up (the faster first)."""
    extrapolated: bool = False
    """Two or more of its buckets are under half the smallest bucket the fit saw: their latency is a guess."""
    beyond: bool = False
    """A bucket of it is over :data:`REACH` times the largest all-reduced: its per-byte time is a guess."""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.step_ms)


@dataclass(frozen=True, slots=True)
class BucketModel:
    """The buckets now and every grouping tried, each replayed on the same iterations."""

    layout: Layout
    comm: AllReduce
    now: Grouping
    tried: tuple[Grouping, ...]
    """Every distinct grouping: DDP's default, the uniform caps of :data:`CAPS_MB`, MG-WFBP's."""
    error: float
    """|the schedule's median tail − the observed median tail| / the median iteration, for the buckets now (the tail:
    from the backward's end to the last all-reduce's)."""
    default: bool
    """Whether the buckets now are DDP's default ones."""
    iterations: int
    launch_ns: float = 0.0
    """What handing a bucket over took the backward's thread (:func:`finish_ns`), 0 where unmeasured."""
    steal: float = 0.0
    """What each ns of all-reduce work beside the backward took from it (:func:`steal_of`), 0 where none."""


def model_buckets(layout: Layout, backwards: Sequence[Backward], comm: AllReduce,
                  launch_ns: float = 0.0, steal: float = 0.0) -> BucketModel:
    """Every grouping tried, predicted on every backward given (at least one). Where α and β were fitted on the
    all-reduces after the backward alone, the stretch κ is the one whose schedule of the buckets now ends where the
    observed all-reduces ended (median over the backwards): the buckets beside the backward are few and their
    durations, on a loaded machine, more scheduling than work, so they are weighed as a whole, not one by one.
    ``launch_ns``: what handing a bucket over takes the backward's thread, ``steal`` what each ns of all-reduce work
    beside the backward takes from it (:func:`finish_ns`); 0 where unmeasured."""
    comm = stretched(layout, backwards, comm)
    typical = _typical(backwards)
    low = comm.sizes < 3  # two sizes cannot tell latency from stretch well below the smallest one

    def grouping(label: str, setting: Mapping[str, object], counts: Sequence[int]) -> Grouping:
        counts = tuple(counts)
        out: dict[int, list[float]] = {-1: [], 0: [], 1: []}
        for b in backwards:
            for bound, steps in out.items():
                per = max(comm.b_ns_per_byte + bound * comm.b_se, 0.0)
                saved = (finish_ns(layout, layout.now, b, comm, per_byte=per)
                         - finish_ns(layout, counts, b, comm, per_byte=per, launch_ns=launch_ns, steal=steal))
                steps.append(b.identity_ms - saved / 1e6)
        ends = sorted((statistics.median(out[-1]), statistics.median(out[1])))
        sent = totals(layout.sizes, counts)
        small = sum(1 for m in sent if m < comm.smallest / 2)
        beyond = bool(comm.largest) and max(sent) > REACH * comm.largest
        return Grouping(label, dict(setting), counts, tuple(out[0]), (ends[0], ends[1]), low and small >= 2, beyond)

    now = grouping("the buckets now", {}, layout.now)
    tried: dict[tuple[int, ...], Grouping] = {}
    default = layout.counts(DEFAULT_LIMITS)
    tried[default] = grouping("DDP's default (bucket_cap_mb unset: 1 MiB first, then 25 MiB)", {}, default)
    for cap in CAPS_MB:
        counts = layout.counts([int(cap * MIB)])
        if counts not in tried:
            tried[counts] = grouping(f"bucket_cap_mb={cap:g}", {"bucket_cap_mb": cap}, counts)
    merged = mg_wfbp(layout, typical, comm)
    caps = limits_for(layout, merged)
    if merged not in tried and caps is not None:
        shown = ", ".join(f"{c:g}" for c in caps)
        tried[merged] = grouping(f"bucket_cap_mb_list=[{shown}] (MG-WFBP)", {"bucket_cap_mb_list": list(caps)}, merged)
    # The schedule's bias, not the iterations' noise: its median tail (last all-reduce past the backward) against
    # the median tail observed, as a share of the iteration.
    modelled = statistics.median(finish_ns(layout, layout.now, b, comm) - b.end for b in backwards)
    observed = statistics.median(b.observed_end - b.end for b in backwards)
    error = abs(modelled - observed) / 1e6 / typical.identity_ms if typical.identity_ms > 0 else 0.0
    return BucketModel(layout, comm, now, tuple(tried.values()), error, layout.now == default, len(backwards),
                       launch_ns, steal)


def stretched(layout: Layout, backwards: Sequence[Backward], comm: AllReduce) -> AllReduce:
    """``comm`` with its stretch under the backward from the buckets' tail (:func:`tail_stretch`) where α and β
    were fitted on the all-reduces after the backward alone; as it is where the joint fit found the stretch too."""
    return tail_stretch(layout, backwards, comm) if comm.after else comm


def tail_stretch(layout: Layout, backwards: Sequence[Backward], comm: AllReduce) -> AllReduce:
    """``comm`` with the κ of :data:`dagtop.model.allreduce.KAPPAS` whose schedule of the buckets now has the median
    tail (last all-reduce's end past the backward's end) nearest the observed one."""
    observed = statistics.median(b.observed_end - b.end for b in backwards)

    def miss(kappa: float) -> float:
        c = dataclasses.replace(comm, kappa=kappa)
        return abs(statistics.median(finish_ns(layout, layout.now, b, c) - b.end for b in backwards) - observed)

    return dataclasses.replace(comm, kappa=min(KAPPAS, key=miss))


def _typical(backwards: Sequence[Backward]) -> Backward:
    """One backward of median shape: each block's ready time as the median of its offset from the backward's end."""
    blocks = {k for b in backwards for k in b.ready}
    ready = {k: int(statistics.median(b.ready[k] - b.end for b in backwards if k in b.ready)) for k in blocks}
    return Backward(-1, ready, 0, 0, statistics.median(b.identity_ms for b in backwards))
