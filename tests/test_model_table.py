"""The columnar event table under the DAG, and a GPU-like iteration whose lanes meet by hand-known edges."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dagtop.model.analysis import _covered_ns, analyse
from dagtop.model.table import build_table
from instrument.events import CATEGORIES
from instrument.wire import Event

MS = 1_000_000


def ev(category: str, phase: str, name: str, lane: str, start_ms: float, end_ms: float, nbytes: int = 0) -> Event:
    return Event(category, phase, name, lane, int(start_ms * MS), int(end_ms * MS), nbytes)


@st.composite
def lanes_and_queries(draw: st.DrawFn) -> tuple[dict[int, list[Event]], dict[int, int], list[tuple[int, str, int]]]:
    events: dict[int, list[Event]] = {}
    for r in range(draw(st.integers(1, 3))):
        evs = []
        for lane in draw(st.lists(st.sampled_from(["main", "gpu", "copy"]), min_size=1, max_size=3, unique=True)):
            t = draw(st.integers(0, 50))
            for _ in range(draw(st.integers(1, 6))):
                d = draw(st.integers(0, 40))
                evs.append(Event(draw(st.sampled_from(CATEGORIES)), "custom", "x", lane, t, t + d, 0))
                t += d + draw(st.integers(0, 10))
        evs.append(Event("allreduce", "allreduce", "bucket 0", "comm", 5, 9, 1))
        draw(st.randoms(use_true_random=False)).shuffle(evs)
        events[r] = evs
    offsets = {r: draw(st.integers(-20, 20)) for r in events}
    queries = [(r, lane, draw(st.integers(-30, 400)))
               for r in events for lane in sorted({e.lane for e in events[r]} - {"comm"})]
    return events, offsets, queries


@settings(max_examples=200, deadline=None)
@given(lanes_and_queries())
@example(({0: [Event("compute", "custom", "x", "main", 0, 1, 0), Event("compute", "custom", "x", "main", 0, 0, 0)]},
          {0: 0}, [(0, "main", 0)]))  # a task of no time arriving after the one it precedes
def test_busy_per_category_matches_a_walk_over_the_lane(
    case: tuple[dict[int, list[Event]], dict[int, int], list[tuple[int, str, int]]]
) -> None:
    events, offsets, queries = case
    t = build_table(events, offsets)
    lane_ids, times, expected = [], [], []
    for r, lane, at in queries:
        i = t.ranks.index(r)
        lane_id = next(k for k in range(t.rank_lane_lo[i], t.rank_lane_hi[i])
                       if t.lane_code[k] == ("main", "gpu", "copy", "comm").index(lane))
        want = np.zeros(len(CATEGORIES))
        for e in events[r]:
            if e.lane == lane:
                s, f = e.start_ns + offsets[r], e.end_ns + offsets[r]
                want[CATEGORIES.index(e.category)] += min(max(at - s, 0), f - s)
        lane_ids.append(lane_id)
        times.append(at)
        expected.append(want)
    got = t.busy(np.array(lane_ids, dtype=np.int64), np.array(times, dtype=np.int64))
    assert np.allclose(got, np.array(expected))
    # Each lane is in time order, whatever order the events arrived in.
    for lo, hi in zip(t.lane_lo, t.lane_hi):
        assert (np.diff(t.start[lo:hi]) >= 0).all()


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 100), st.integers(0, 30)), max_size=30))
def test_a_ranks_time_in_flight_is_the_union_of_its_spans(spans: list[tuple[int, int, int]]) -> None:
    spans.sort()
    rank = np.array([r for r, _, _ in spans], dtype=np.int64)
    start = np.array([s for _, s, _ in spans], dtype=np.int64)
    end = start + np.array([d for _, _, d in spans], dtype=np.int64)
    covered = _covered_ns(rank, start, end, 4)
    for r in range(4):
        instants = set()
        for q, s, d in spans:
            if q == r:
                instants.update(range(s, s + d))
        assert covered[r] == len(instants)


def gpu_rank(t0: float = 0.0) -> list[Event]:
    """Loading on the training thread, the copy on the copy stream, compute and update on the GPU stream."""
    return [
        ev("io", "load", "next", "main", t0 + 0, t0 + 5),
        ev("pcie", "h2d", "to_device", "copy", t0 + 6, t0 + 9, 4096),
        ev("compute", "forward", "body", "gpu", t0 + 10, t0 + 20),
        ev("compute", "backward", "body", "gpu", t0 + 20, t0 + 35),
        ev("allreduce", "allreduce", "bucket 0", "comm", t0 + 35, t0 + 45, 1 << 20),
        ev("compute", "update", "optimizer.step", "gpu", t0 + 45, t0 + 47),
    ]


def test_a_gpu_iteration_is_one_path_through_its_three_lanes() -> None:
    a = analyse(1, {0: gpu_rank(), 1: gpu_rank()}, {}, {0: 0, 1: 0})
    assert a.measured_ms == pytest.approx(47.0) and a.predicted_ms == pytest.approx(47.0)
    assert [s.phase for s in a.critical_path] == ["load", "gap", "h2d", "gap", "forward", "backward", "allreduce",
                                                  "update"]
    w = {x.change: x.iteration_ms for x in a.what_if}
    # The copy waits for the batch and the forward for the copy: hiding the 5 ms load moves all of it.
    assert w["I/O hidden"] == pytest.approx(42.0)
    assert w["perfect overlap"] == pytest.approx(37.0)
    tasks = {(t.rank, t.lane, t.name) for t in a.tasks}
    assert (0, "copy", "to_device") in tasks and (1, "gpu", "optimizer.step") in tasks and len(a.tasks) == 12


def test_the_order_events_arrive_in_changes_nothing() -> None:
    ordered = analyse(1, {0: gpu_rank(), 1: gpu_rank(0.5)}, {}, {0: 0, 1: 0})
    shuffled_events = {0: gpu_rank(), 1: gpu_rank(0.5)}
    for evs in shuffled_events.values():
        random.Random(7).shuffle(evs)
    shuffled = analyse(1, shuffled_events, {}, {0: 0, 1: 0})
    assert shuffled.critical_path == ordered.critical_path
    assert shuffled.what_if == ordered.what_if
    assert sorted(shuffled.tasks) == sorted(ordered.tasks)
