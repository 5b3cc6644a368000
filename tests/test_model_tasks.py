"""The tasks an analysis hands over: Event's shape with a rank in front, grouped once; and no work done twice."""

from __future__ import annotations

import dataclasses
import doctest
from typing import Any

import pytest

from dagtop.model import analysis as analysis_module
from dagtop.model import dag, tasks
from dagtop.model import whatif as whatif_module
from dagtop.model.analysis import analyse
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.model.tasks import Task, Tasks
from instrument.events import Event

MS = 1_000_000


def gpu_rank(late_ms: float = 0.0) -> list[Event]:
    """A rank with three lanes (main, copy, gpu) and a collective, events deliberately not in lane order."""
    t = int(late_ms * MS)
    return [
        Event("compute", "update", "optimizer.step", "gpu", 45 * MS + t, 47 * MS + t),
        Event("io", "load", "next", "main", 0, 5 * MS + t),
        Event("pcie", "h2d", "to_device", "copy", 5 * MS + t, 7 * MS + t),
        Event("allreduce", "allreduce", "bucket 0", "comm", 30 * MS + t, 40 * MS + t, 4096),
        Event("compute", "forward", "net", "gpu", 7 * MS + t, 17 * MS + t),
        Event("compute", "backward", "net", "gpu", 17 * MS + t, 30 * MS + t),
    ]


def test_a_task_is_an_event_with_its_rank_in_front() -> None:
    assert Task._fields == ("rank", *Event._fields)
    assert Task._field_defaults == Event._field_defaults
    e = Event("io", "load", "next", "main", 3, 10, 0)
    assert Task(2, *e)[1:] == e and Task(2, *e).duration_ns == e.duration_ns == 7


def test_the_analysis_hands_over_its_tasks_already_grouped_by_rank() -> None:
    a = analyse(1, {0: gpu_rank(), 1: gpu_rank(2.0), 3: gpu_rank(1.0)[1:2]}, {}, {0: 0, 1: 0, 3: 0})
    assert isinstance(a.tasks, Tasks) and len(a.tasks) == 13
    assert set(a.tasks.by_rank) == {0, 1, 3}
    for r, mine in a.tasks.by_rank.items():
        assert mine == tuple(t for t in a.tasks if t.rank == r)  # the analysis's order, cut per rank
        assert sorted(a.tasks.lanes[r]) == sorted({t.lane for t in mine})
    assert sorted(a.tasks.lanes[0]) == ["comm", "copy", "gpu", "main"] and a.tasks.lanes[3] == ("main",)
    assert a.tasks.end_ns == 49 * MS
    # The grouping the analysis cuts from its columns is the one a plain tuple of the same tasks gets.
    plain = Tasks(tuple(a.tasks))
    assert plain.by_rank == a.tasks.by_rank and plain.end_ns == a.tasks.end_ns
    assert {r: set(v) for r, v in plain.lanes.items()} == {r: set(v) for r, v in a.tasks.lanes.items()}


def test_a_ranks_tasks_are_made_when_read_and_only_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1024 ranks the screen draws some 20: making every rank's 400 tuples each iteration cost the collector
    0.1 s. Reading one rank makes that rank's tasks, once; the whole sequence is made only when iterated."""
    made: list[int] = []
    rows = tasks.TaskColumns.rows

    def counting(self: tasks.TaskColumns, index: Any) -> tuple[Task, ...]:
        out = rows(self, index)
        made.append(len(out))
        return out

    monkeypatch.setattr(tasks.TaskColumns, "rows", counting)
    frames = synthetic_frames(SyntheticJob(ranks=64, blocks=20), iterations=2)
    p = Pipeline(window=None)
    p.feed(frames)
    p.finish()
    a = p.analyses()[-1]
    ends = a.tasks.last_end_by_rank()
    assert made == [] and len(a.tasks) > 64 * 40 and a.tasks.end_ns == max(ends.values())  # counted, not made
    mine = a.tasks.by_rank[5]
    assert made == [len(mine)] and a.tasks.by_rank[5] is mine and {t.rank for t in mine} == {5}
    everything = tuple(a.tasks)
    assert made[-1] == len(everything) == len(a.tasks)
    assert mine == tuple(t for t in everything if t.rank == 5)
    assert Tasks(everything) == a.tasks and Tasks(everything).by_rank == a.tasks.by_rank
    assert Tasks(everything).last_end_by_rank() == ends and ends[5] == max(t.end_ns for t in mine)
    with pytest.raises(KeyError):
        a.tasks.by_rank[64]


def test_hand_built_and_given_up_tasks_are_grouped_too() -> None:
    a = analyse(1, {0: gpu_rank()}, {}, {0: 0})
    hand = dataclasses.replace(a, tasks=tuple(a.tasks))
    assert isinstance(hand.tasks, Tasks) and hand.tasks.by_rank[0] == tuple(a.tasks)
    empty = dataclasses.replace(a, tasks=())
    assert isinstance(empty.tasks, Tasks) and empty.tasks.by_rank == {} and empty.tasks.end_ns is None


def test_tasks_given_up_under_the_budget_leave_the_oldest_analyses(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagtop.model import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "TASK_BUDGET", 200)
    p = Pipeline(window=None)
    p.feed(synthetic_frames(SyntheticJob(ranks=2, blocks=10), iterations=6))
    kept = [len(a.tasks) for a in p.analyses()]
    assert kept[-1] > 0 and kept[0] == 0 and sum(kept) <= 200
    assert all(a.tasks.by_rank == {} for a in p.analyses() if not a.tasks)


def test_each_analysis_replays_the_identity_once_and_walks_the_critical_path_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replayed: list[int] = []
    walks: list[int] = []

    def counting(fn: Any, log: list[int], size: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            log.append(size(args))
            return fn(*args)
        return wrapper

    monkeypatch.setattr(analysis_module, "replay", counting(analysis_module.replay, replayed, lambda a: a[1].shape[0]))
    monkeypatch.setattr(whatif_module, "replay", counting(whatif_module.replay, replayed, lambda a: a[1].shape[0]))
    monkeypatch.setattr(analysis_module, "critical_nodes", counting(analysis_module.critical_nodes, walks, len))
    a = analyse(1, {0: gpu_rank(), 1: gpu_rank(8.0)}, {}, {0: 0, 1: 0})
    assert a.straggler is not None  # so the straggler change is among the what-ifs too
    # One replay of the identity alone, then one of every change at once; none replays the identity again.
    assert replayed == [1, len(a.what_if)]
    assert len(walks) == 1


@pytest.mark.parametrize("module", [dag, tasks])
def test_the_docstring_examples_hold(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
