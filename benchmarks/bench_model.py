"""Per-iteration cost of the model on synthetic jobs: DAG assembly + critical path + what-ifs, by rank count.

Run: ``python benchmarks/bench_model.py [--ranks 64 256 1024] [--tasks 400] [--repeat 15]``. Prints the median
over repeats of each stage for one iteration. The acceptance figure (issue #3) is "asm+path" at 64 ranks ×
400 tasks: the DAG assembled and its critical path found; "analysis" adds the straggler, the per-rank rows
and every what-if replay, and is held to the same budget.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx
import numpy as np

from dagtop.model.analysis import analyse, analyse_dag
from dagtop.model.dag import assemble
from dagtop.model.replay import critical_nodes, critical_segments, durations, replay
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire
from instrument.events import CATEGORIES


def _time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _assemble_and_path(events: dict[int, Sequence[wire.Event]], previous: dict[int, int]) -> Any:
    dag = assemble(events, {}, previous)
    start, end = replay(dag, durations(dag, np.ones((1, len(dag.ranks) + 1, len(CATEGORIES)))))
    return critical_segments(dag, critical_nodes(dag, end[0]), start[0], end[0], max(dag.origin.values()))


def _naive_networkx(events: dict[int, Sequence[wire.Event]]) -> float:
    """A node per task, edges in program order and through each bucket's collective: the approach not taken."""
    g = nx.DiGraph()
    for r, evs in events.items():
        prev = None
        for i, e in enumerate(evs):
            if e.lane == "comm":
                g.add_edge((r, i), ("coll", e.name), weight=0)
                continue
            g.add_node((r, i), weight=e.end_ns - e.start_ns)
            if prev is not None:
                g.add_edge(prev, (r, i))
            prev = (r, i)
    return float(nx.dag_longest_path_length(g))


def _row(ranks: int, buckets: int, blocks: int, repeat: int) -> None:
    """Time every stage for one rank count and print its row."""
    job = SyntheticJob(ranks=ranks, blocks=blocks, buckets=buckets, slow_ranks=(1,), slow_category="io")
    frames = synthetic_frames(job, iterations=2, hello=False)
    by_it: dict[int, dict[int, Sequence[wire.Event]]] = {}
    for f in frames:
        b = wire.decode(f.payload)
        assert isinstance(b, wire.IterationBatch)
        by_it.setdefault(b.iteration, {})[b.rank] = b.events
    decode_ms = _time(lambda: [wire.decode(f.payload) for f in frames], max(1, repeat // 3)) / 2
    events = by_it[1]
    previous = {r: max(e.end_ns for e in evs) for r, evs in by_it[0].items()}  # outside the timings
    tasks = sum(len(v) for v in events.values())
    assemble_ms = _time(lambda: assemble(events, {}, previous), repeat)
    path_ms = _time(lambda: _assemble_and_path(events, previous), repeat)
    analysis_ms = _time(lambda: analyse(1, events, {}, previous, with_tasks=False), repeat)
    dag = assemble(events, {}, previous)
    full_ms = _time(lambda: analyse_dag(1, dag, True, None, with_tasks=True), repeat) + assemble_ms
    naive = f"{_time(lambda: _naive_networkx(events), 1):9.1f}" if ranks <= 64 else f"{'-':>9}"
    print(f"{ranks:>6} {tasks:>8} {dag.nodes:>6} {decode_ms:9.1f} {assemble_ms:9.1f} {path_ms:9.1f}"
          f" {analysis_ms:9.1f} {analysis_ms * 1e3 / tasks:8.2f}µ {full_ms:10.1f} {naive}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--tasks", type=int, default=400, help="tasks per rank per iteration (about)")
    parser.add_argument("--buckets", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    blocks = max(1, (args.tasks - 3 - args.buckets) // 2)
    print(f"{'ranks':>6} {'tasks':>8} {'nodes':>6} {'decode':>9} {'assemble':>9} {'asm+path':>9} {'analysis':>9}"
          f" {'per task':>9} {'+tasks':>10} {'naive nx':>9}")
    for ranks in args.ranks:
        _row(ranks, args.buckets, blocks, args.repeat if ranks <= 256 else max(1, args.repeat // 3))
    print("ms per iteration, median of repeats. asm+path = DAG assembly + critical path (the acceptance figure);\n"
          "analysis = that + straggler, per-rank rows and every what-if; decode = wire.decode of the ranks'\n"
          "frames; +tasks = analysis that also hands over the tasks the UI draws, grouped by rank (as columns: a\n"
          "rank's Task tuples are made when the screen reads it); naive nx = a node per task in networkx, longest\n"
          "path only.")


if __name__ == "__main__":
    main()
