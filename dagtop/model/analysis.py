"""One iteration's analysis: measured and predicted time, critical path, straggler, per-rank rows, what-ifs."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from dagtop.model.change import Change
from dagtop.model.dag import ALLREDUCE, COLLECTIVE, RUN, IterationDag, assemble
from dagtop.model.interference import InterferenceFit
from dagtop.model.replay import CriticalNodes, critical_nodes, critical_segments, durations, replay, shares
from dagtop.model.snapshot import AlphaBeta, Collective, IterationAnalysis, RankRow, Segment, Straggler
from dagtop.model.table import F64, I64, concat_ranges, run_starts
from dagtop.model.tasks import NO_TASKS
from dagtop.model.whatif import CoHost, run_scenarios, scenarios, unexplained, what_ifs
from instrument.events import CATEGORIES, CATEGORY_CODE, Event

STRAGGLER_MIN_MS = 1.0
STRAGGLER_FRACTION = 0.10
"""A rank is the straggler when the collective on the critical path waited for it longer than
max(STRAGGLER_MIN_MS, STRAGGLER_FRACTION × measured iteration) beyond the median of the other ranks' ready times."""

OTHER = CATEGORY_CODE["other"]


def analyse(
    iteration: int,
    events: Mapping[int, Sequence[Event]],
    offsets: Mapping[int, int],
    previous_end: Mapping[int, int],
    complete: bool = True,
    comm: AlphaBeta | None = None,
    with_tasks: bool = True,
    interference: InterferenceFit | None = None,
    learn: bool = False,
    bandwidth_gbps: float | None = None,
    suspect: tuple[int, str] | None = None,
    cohosts: Mapping[int, CoHost] | None = None,
) -> IterationAnalysis:
    """Analyse one iteration from the events of the ranks that reported it.

    Measured time is from the latest previous-iteration end across ranks (``previous_end``; a rank's first
    task start where unknown) to the latest task end of this iteration: update end to update end of the
    slowest rank. The prediction is the identity replay of the DAG over the same span.

    Args:
        suspect: (rank, category) of the straggler the steady verdict names so far, whose 'straggler at median'
            this iteration replays; None: no such what-if.
        cohosts: the CPU ranks sharing their host with other ranks (:func:`dagtop.model.whatif.cohosts`).
    """
    dag = assemble(events, offsets, previous_end)
    return analyse_dag(iteration, dag, complete, comm, with_tasks, interference, learn, bandwidth_gbps, suspect,
                       cohosts)


def analyse_dag(
    iteration: int, dag: IterationDag, complete: bool, comm: AlphaBeta | None, with_tasks: bool = True,
    interference: InterferenceFit | None = None, learn: bool = False, bandwidth_gbps: float | None = None,
    suspect: tuple[int, str] | None = None, cohosts: Mapping[int, CoHost] | None = None,
) -> IterationAnalysis:
    """As :func:`analyse`; ``interference``, when given, is read for the what-ifs, then fed this iteration
    (``learn``: not for warm-up iterations)."""
    origin = max(dag.origin.values()) if dag.origin else 0
    final = int(dag.b.max()) if dag.nodes else origin
    measured_ms = (final - origin) / 1e6
    # The identity replay once, alone: the iteration's late rank follows from its critical path.
    ident = np.ones((1, len(dag.ranks) + 1, len(CATEGORIES)))
    start, end = replay(dag, durations(dag, ident))
    nodes = critical_nodes(dag, end[0])
    path = critical_segments(dag, nodes, start[0], end[0], origin)
    predicted_ms = (float(end[0].max()) - origin) / 1e6
    path_shares = shares(path)
    busy = _busy(dag)
    deviation = _deviation(dag, busy)
    straggler = _straggler(dag, nodes, end[0], measured_ms, deviation)
    cases = scenarios(dag, suspect, comm, busy, bandwidth_gbps, cohosts)
    fitted = tuple(interference.model().values()) if interference is not None else ()
    odd = unexplained(fitted)
    if odd:
        cases = [dataclasses.replace(c, unpredictable=odd) if c.comm_ratio is not None and not c.unpredictable else c
                 for c in cases]
    predicted = run_scenarios(dag, cases, origin, busy, {f.lane: f.applied for f in fitted})
    if interference is not None and learn:
        interference.add(dag)
    # Exposed communication is what the iteration would lose if the collectives were free: with one rank and
    # one bucket per layer that is exactly the seed paper's tc_start[1] + t_c[1] - (tb_start[1] + t_b[1]).
    free_comm = next((ms for c, ms in zip(cases, predicted) if c.change is Change.PERFECT_OVERLAP), predicted_ms)
    exposed_ns = max(predicted_ms - free_comm, 0.0) * 1e6
    comm_ns = float(dag.catsum[dag.kind == COLLECTIVE, ALLREDUCE].sum())
    overlap = 1.0 if comm_ns <= 0 else min(max(1.0 - exposed_ns / comm_ns, 0.0), 1.0)
    return IterationAnalysis(
        iteration=iteration,
        complete=complete,
        ranks=dag.ranks,
        origin_ns=origin,
        measured_ms=measured_ms,
        predicted_ms=predicted_ms,
        tasks=dag.table.tasks() if with_tasks else NO_TASKS,
        collectives=tuple(
            Collective(c.name, c.bytes, dict(c.ready), c.start_ns, c.end_ns, max(c.ready, key=c.ready.__getitem__))
            for c in dag.collectives
        ),
        critical_path=path,
        shares=path_shares,
        bottleneck=max(CATEGORIES, key=lambda c: path_shares.get(c, 0.0)),
        straggler=straggler,
        exposed_comm_ms=exposed_ns / 1e6,
        overlap_ratio=overlap,
        per_rank=_rows(dag, busy, deviation, origin),
        what_if=what_ifs(predicted_ms, cases, predicted),
        interference=fitted,
        network=comm if len(dag.ranks) > 1 and dag.collectives else None,
    )


def _busy(dag: IterationDag) -> dict[int, F64]:
    """Rank → ns per category on its compute lanes, untimed host gaps counted as 'other'."""
    out = {r: np.zeros(len(CATEGORIES)) for r in dag.ranks}
    runs = dag.kind == RUN
    rows = np.searchsorted(np.array(dag.ranks), dag.rank_of[runs])
    acc = np.zeros((len(dag.ranks), len(CATEGORIES)))
    np.add.at(acc, rows, dag.catsum[runs])
    gaps = np.zeros(len(dag.ranks))
    np.add.at(gaps, rows, dag.internal[runs] + dag.gap[runs])
    acc[:, OTHER] += gaps
    for i, r in enumerate(dag.ranks):
        out[r] = acc[i]
    return out


def _deviation(dag: IterationDag, busy: dict[int, F64]) -> dict[int, float]:
    """Rank → its busy ms (io + pcie + compute) minus the median of the other ranks' (0 for a lone rank)."""
    work = np.array([float(busy[r][_WORK].sum()) / 1e6 for r in dag.ranks])
    if len(work) < 2:
        return dict.fromkeys(dag.ranks, 0.0)
    return dict(zip(dag.ranks, (work - medians_of_the_others(work)).tolist()))


def medians_of_the_others(values: F64) -> F64:
    """For each value, the median of all the others: one sort, not a median per value (1024 ranks: 1024 of 1023).

    Leaving out the value at sorted position p shifts every position from p on down by one; the median of the
    n − 1 left is at positions (n − 2) // 2 and (n − 1) // 2 of what is left.
    """
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    n = len(values)
    p = np.empty(n, dtype=np.int64)
    p[order] = np.arange(n)

    def left(j: int) -> F64:  # position j of what is left once position p is out, for every p
        at: F64 = np.where(j < p, ranked[j], ranked[min(j + 1, n - 1)])
        return at

    out: F64 = (left((n - 2) // 2) + left((n - 1) // 2)) / 2
    return out


def _straggler(dag: IterationDag, path: CriticalNodes, end: F64, measured_ms: float, deviation: dict[int, float]
               ) -> Straggler | None:
    """The rank the critical path jumps to at a collective, if it kept the others waiting long enough."""
    if len(dag.ranks) < 2:
        return None
    for v, e in path:
        if dag.kind[v] != COLLECTIVE:
            continue
        if dag.kind[dag.src[e]] != RUN:
            continue  # bound by the previous collective: the channel, not a rank
        c = next(c for c in dag.collectives if c.node == v)
        g = int(dag.rank_of[dag.src[e]])
        others = [t for r, t in c.ready.items() if r != g]
        if not others:
            return None
        late_ms = (c.ready[g] - statistics.median(others)) / 1e6
        if late_ms <= max(STRAGGLER_MIN_MS, STRAGGLER_FRACTION * measured_ms):
            return None
        before = _before(dag, c.ready)
        excess = before[g] - np.median(np.stack([x for r, x in before.items() if r != g]), axis=0)
        excess[ALLREDUCE] = -np.inf  # waiting for a collective is not where time is lost
        k = int(np.argmax(excess))
        return Straggler(g, CATEGORIES[k], float(max(excess[k], 0.0)) / 1e6, deviation[g])
    return None


def _before(dag: IterationDag, times: Mapping[int, int]) -> dict[int, F64]:
    """Rank → ns per category from its origin up to ``times[rank]`` (its bucket-ready point), gaps as 'other'."""
    t = dag.table
    index = {r: i for i, r in enumerate(dag.ranks)}
    rows = np.array([index[r] for r in times], dtype=np.int64)
    at = np.array(list(times.values()), dtype=np.int64)
    lo, hi = t.rank_lane_lo[rows], t.rank_lane_hi[rows]
    query = np.repeat(np.arange(len(rows)), hi - lo)
    lanes = concat_ranges(lo, hi)
    total = np.zeros((len(rows), len(CATEGORIES)))
    np.add.at(total, query, t.busy(lanes, at[query]))
    origin = np.array([dag.origin[r] for r in times], dtype=np.float64)
    total[:, OTHER] += np.maximum(at - origin - total.sum(axis=1), 0.0)
    return dict(zip(times, total))


def _rows(dag: IterationDag, busy: dict[int, F64], deviation: dict[int, float], origin: int) -> tuple[RankRow, ...]:
    """The per-rank rows; none marked the straggler: that is the steady verdict's to say (:mod:`dagtop.model.verdict`)."""
    t = dag.table
    last = np.full(len(dag.ranks), origin, dtype=np.int64)
    if t.lanes:
        np.maximum.at(last, t.lane_rank, t.end[t.lane_hi - 1])
    it_ms = dict(zip(dag.ranks, ((last - origin) / 1e6).tolist()))
    covered = _covered_ns(t.comm_rank_idx, t.comm_start, t.comm_end, len(dag.ranks)) / 1e6
    comm = dict(zip(dag.ranks, covered.tolist()))
    rows = []
    for r in dag.ranks:
        b = busy[r] / 1e6
        rows.append(RankRow(r, it_ms[r], float(b[CATEGORY_CODE["io"]]), float(b[CATEGORY_CODE["pcie"]]),
                            float(b[CATEGORY_CODE["compute"]]), comm[r], float(b[OTHER]), deviation[r], False))
    return tuple(rows)


_WORK = [CATEGORY_CODE[c] for c in ("io", "pcie", "compute")]
"""The categories a rank spends working, as opposed to waiting ('other' holds its waits for the collectives)."""


def _covered_ns(rank: I64, start: I64, end: I64, ranks: int) -> F64:
    """Per rank index, the length of the union of its [start, end) spans (given sorted by rank, then start):
    buckets in flight together (gloo runs them concurrently) count once."""
    out = np.zeros(ranks)
    if not len(rank):
        return out
    t0 = int(start.min())
    span = int(max(end.max(), start.max())) - t0 + 1
    # The furthest end so far within each rank: the rank term keeps one rank's reach out of the next's.
    reach = np.maximum.accumulate(rank * span + (end - t0)) - rank * span + t0
    prev = np.where(run_starts(rank), start, np.concatenate((start[:1], reach[:-1])))
    np.add.at(out, rank, np.maximum(end - np.maximum(start, prev), 0))
    return out


def model_error(a: IterationAnalysis) -> float:
    """|predicted − measured| / measured (0 for an empty iteration)."""
    return abs(a.predicted_ms - a.measured_ms) / a.measured_ms if a.measured_ms > 0 else 0.0


def segments_ms(path: Sequence[Segment]) -> dict[str, float]:
    """Category → ms on the critical path."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for s in path:
        out[s.category] = out.get(s.category, 0.0) + s.duration_ms
    return out
