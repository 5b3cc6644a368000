"""One iteration's analysis: measured and predicted time, critical path, straggler, per-rank rows, what-ifs."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from dagtop.model.dag import (
    ALLREDUCE,
    CATEGORIES,
    CATEGORY_INDEX,
    COLLECTIVE,
    F64,
    RUN,
    IterationDag,
    assemble,
)
from dagtop.model.replay import critical_nodes, critical_segments, durations, replay, shares
from dagtop.model.snapshot import Collective, IterationAnalysis, RankRow, Segment, Straggler, Task
from dagtop.model.whatif import PERFECT_OVERLAP, AlphaBeta, run_scenarios, scenarios, what_ifs
from instrument.wire import Event

STRAGGLER_MIN_MS = 1.0
STRAGGLER_FRACTION = 0.10
"""A rank is the straggler when the collective on the critical path waited for it longer than
max(STRAGGLER_MIN_MS, STRAGGLER_FRACTION × measured iteration) beyond the median of the other ranks' ready times."""

OTHER = CATEGORY_INDEX["other"]


def analyse(
    iteration: int,
    events: Mapping[int, Sequence[Event]],
    offsets: Mapping[int, int],
    previous_end: Mapping[int, int],
    complete: bool = True,
    comm: AlphaBeta | None = None,
    with_tasks: bool = True,
) -> IterationAnalysis:
    """Analyse one iteration from the events of the ranks that reported it.

    Measured time is from the latest previous-iteration end across ranks (``previous_end``; a rank's first
    task start where unknown) to the latest task end of this iteration: update end to update end of the
    slowest rank. The prediction is the identity replay of the DAG over the same span.
    """
    dag = assemble(events, offsets, previous_end)
    return analyse_dag(iteration, dag, complete, comm, with_tasks)


def analyse_dag(
    iteration: int, dag: IterationDag, complete: bool, comm: AlphaBeta | None, with_tasks: bool = True
) -> IterationAnalysis:
    origin = max(dag.origin.values()) if dag.origin else 0
    final = int(dag.b.max()) if dag.nodes else origin
    measured_ms = (final - origin) / 1e6
    ident = np.ones((1, len(dag.ranks) + 1, len(CATEGORIES)))
    start, end = replay(dag, durations(dag, ident))
    path = critical_segments(dag, start[0], end[0], origin)
    path_shares = shares(path)
    busy = _busy(dag)
    straggler = _straggler(dag, end[0], measured_ms)
    cases = scenarios(dag, straggler, comm, busy)
    predicted = run_scenarios(dag, cases, origin, busy)
    # Exposed communication is what the iteration would lose if the collectives were free: with one rank and
    # one bucket per layer that is exactly the seed paper's tc_start[1] + t_c[1] - (tb_start[1] + t_b[1]).
    free_comm = next(ms for c, ms in zip(cases, predicted) if c.change == PERFECT_OVERLAP)
    exposed_ns = max(predicted[0] - free_comm, 0.0) * 1e6
    comm_ns = float(dag.catsum[dag.kind == COLLECTIVE, ALLREDUCE].sum())
    overlap = 1.0 if comm_ns <= 0 else min(max(1.0 - exposed_ns / comm_ns, 0.0), 1.0)
    return IterationAnalysis(
        iteration=iteration,
        complete=complete,
        ranks=dag.ranks,
        origin_ns=origin,
        measured_ms=measured_ms,
        predicted_ms=predicted[0],
        tasks=_tasks(dag) if with_tasks else (),
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
        per_rank=_rows(dag, busy, straggler),
        what_if=what_ifs(cases, predicted),
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


def _straggler(dag: IterationDag, end: F64, measured_ms: float) -> Straggler | None:
    """The rank the critical path jumps to at a collective, if it kept the others waiting long enough."""
    if len(dag.ranks) < 2:
        return None
    for v, via in critical_nodes(dag, end):
        if dag.kind[v] != COLLECTIVE:
            continue
        lo, hi = int(dag.dst_ptr[v]), int(dag.dst_ptr[v + 1])
        e = lo + int(np.argmax(end[dag.src[lo:hi]] + dag.lat[lo:hi]))
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
        before = {r: _before(dag, r, t) for r, t in c.ready.items()}
        excess = before[g] - np.median(np.stack([x for r, x in before.items() if r != g]), axis=0)
        excess[ALLREDUCE] = -np.inf  # waiting for a collective is not where time is lost
        k = int(np.argmax(excess))
        return Straggler(g, CATEGORIES[k], float(max(excess[k], 0.0)) / 1e6)
    return None


def _before(dag: IterationDag, rank: int, t: int) -> F64:
    """ns per category on ``rank`` from its origin up to ``t`` (its bucket-ready point), gaps as 'other'."""
    total = np.zeros(len(CATEGORIES))
    for lane in dag.lanes:
        if lane.rank == rank:
            total += lane.busy(np.array([t, int(lane.start[0])], dtype=np.int64))[0]
    total[OTHER] += max(t - dag.origin[rank] - total.sum(), 0.0)
    return total


def _rows(dag: IterationDag, busy: dict[int, F64], straggler: Straggler | None) -> tuple[RankRow, ...]:
    last = {r: dag.origin[r] for r in dag.ranks}
    for lane in dag.lanes:
        last[lane.rank] = max(last[lane.rank], int(lane.end[-1]))
    it_ms = {r: (last[r] - dag.origin[r]) / 1e6 for r in dag.ranks}
    work = {r: float(busy[r][_WORK].sum()) / 1e6 for r in dag.ranks}
    med = statistics.median(work.values()) if work else 0.0
    rows = []
    for r in dag.ranks:
        b = busy[r] / 1e6
        comm_ms = _covered_ns([(e.start_ns, e.end_ns) for e in dag.comm.get(r, ())]) / 1e6
        rows.append(RankRow(r, it_ms[r], float(b[CATEGORY_INDEX["io"]]), float(b[CATEGORY_INDEX["pcie"]]),
                            float(b[CATEGORY_INDEX["compute"]]), comm_ms, float(b[OTHER]), work[r] - med,
                            straggler is not None and straggler.rank == r))
    return tuple(rows)


_WORK = [CATEGORY_INDEX[c] for c in ("io", "pcie", "compute")]
"""The categories a rank spends working, as opposed to waiting ('other' holds its waits for the collectives)."""


def _covered_ns(spans: Sequence[tuple[int, int]]) -> int:
    """Length of the union of ``spans``: buckets in flight together (gloo runs them concurrently) count once."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _tasks(dag: IterationDag) -> tuple[Task, ...]:
    out: list[Task] = []
    for r, evs in [(lane.rank, lane.events) for lane in dag.lanes] + list(dag.comm.items()):
        off = dag.offsets.get(r, 0)
        out.extend(Task(r, e.lane, e.category, e.phase, e.name, e.start_ns + off, e.end_ns + off, e.bytes)
                   for e in evs)
    return tuple(out)


def model_error(a: IterationAnalysis) -> float:
    """|predicted − measured| / measured (0 for an empty iteration)."""
    return abs(a.predicted_ms - a.measured_ms) / a.measured_ms if a.measured_ms > 0 else 0.0


def segments_ms(path: Sequence[Segment]) -> dict[str, float]:
    """Category → ms on the critical path."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for s in path:
        out[s.category] = out.get(s.category, 0.0) + s.duration_ms
    return out
