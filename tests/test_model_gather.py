"""FSDP's collectives in the model, on hand-built iterations: an all-gather gates the compute after it, a
reduce-scatter gates it only where it held the rank's compute lane, and DDP buckets keep gating only the update;
the screen names them on the critical path."""

from __future__ import annotations

import pytest

from dagtop.model.analysis import analyse
from dagtop.model.dag import assemble
from dagtop.model.snapshot import IterationAnalysis
from instrument.wire import Event

MS = 1_000_000


def ev(category: str, phase: str, name: str, lane: str, start_ms: float, end_ms: float, nbytes: int = 0) -> Event:
    return Event(category, phase, name, lane, int(start_ms * MS), int(end_ms * MS), nbytes)


def comm(name: str, start_ms: float, end_ms: float) -> Event:
    return ev("allreduce", "allreduce", name, "comm", start_ms, end_ms, 4096)


def cpu_fsdp_rank(late_ms: float = 0.0) -> list[Event]:
    """Two units on CPU/gloo, every collective synchronous on the training thread (the lane idles meanwhile);
    0.5 ms of untimed host work (copy-out, hooks) after each collective. ``late_ms`` delays the first forward."""
    return [
        ev("io", "load", "next", "main", -1, 0),
        comm("all-gather b0", 0, 2),
        ev("compute", "forward", "b0", "main", 2.5, 4.5 + late_ms),
        comm("all-gather b1", 5 + late_ms, 7 + late_ms),
        ev("compute", "forward", "b1", "main", 7.5 + late_ms, 9.5 + late_ms),
        ev("compute", "backward", "b1", "main", 10 + late_ms, 12 + late_ms),
        comm("reduce-scatter b1", 12 + late_ms, 14 + late_ms),
        comm("all-gather b0 (backward)", 14.5 + late_ms, 16 + late_ms),
        ev("compute", "backward", "b0", "main", 16.5 + late_ms, 18.5 + late_ms),
        comm("reduce-scatter b0", 18.5 + late_ms, 20.5 + late_ms),
        ev("compute", "update", "optimizer.step", "main", 21 + late_ms, 22 + late_ms),
    ]


def what_if(a: IterationAnalysis) -> dict[str, float]:
    return {w.change: w.iteration_ms for w in a.what_if}


def test_synchronous_fsdp_collectives_are_on_the_critical_path() -> None:
    a = analyse(1, {0: cpu_fsdp_rank()}, {}, {0: -1 * MS})
    total, collectives = 23.0, 2 + 2 + 2 + 1.5 + 2
    assert a.measured_ms == pytest.approx(total)
    assert a.predicted_ms == pytest.approx(total)
    on_path = [s.name for s in a.critical_path if s.category == "allreduce"]
    assert on_path == ["all-gather b0", "all-gather b1", "reduce-scatter b1", "all-gather b0 (backward)",
                       "reduce-scatter b0"]
    assert a.shares["allreduce"] == pytest.approx(collectives / total)
    assert a.shares["compute"] == pytest.approx(9 / total)
    assert a.shares["io"] == pytest.approx(1 / total)
    assert a.exposed_comm_ms == pytest.approx(collectives)
    w = what_if(a)
    assert w["perfect overlap"] == pytest.approx(total - collectives)
    assert w["all-reduce ×0.5"] == pytest.approx(total - collectives / 2)
    assert w["all-reduce ×2"] == pytest.approx(total + collectives)


def test_the_same_waits_named_as_buckets_gate_only_the_update() -> None:
    renamed = [e._replace(name=f"bucket {i}") if e.lane == "comm" else e for i, e in enumerate(cpu_fsdp_rank())]
    a = analyse(1, {0: renamed}, {}, {0: -1 * MS})
    assert a.predicted_ms == pytest.approx(23.0)
    # Only the last collective is waited for (by the update): the rest of the waiting is untimed host work.
    assert [s.name for s in a.critical_path if s.category == "allreduce"] == ["bucket 9"]
    assert what_if(a)["perfect overlap"] == pytest.approx(23.0 - 2)


def test_an_all_gather_waits_for_the_latest_rank() -> None:
    a = analyse(1, {0: cpu_fsdp_rank(), 1: cpu_fsdp_rank(late_ms=3.0)}, {}, {0: -1 * MS, 1: -1 * MS})
    gather = next(c for c in a.collectives if c.name == "all-gather b1")
    assert gather.gating_rank == 1 and gather.start_ns == 8 * MS
    # Rank 0 cannot run b1 before rank 1 has issued the gather: the path jumps to rank 1 there, then stays.
    assert a.predicted_ms == pytest.approx(a.measured_ms)
    path = [(s.rank, s.name) for s in a.critical_path if s.category == "compute"]
    assert path[0] == (1, "b0") and path[-1] == (1, "optimizer.step")


def test_an_all_gather_that_ends_under_running_compute_delays_only_what_follows() -> None:
    # Prefetch: the gather of b1 runs under b0's forward (a GPU's streams); b1 needs it, b0 does not.
    rank = [ev("compute", "forward", "b0", "main", 0, 4), comm("all-gather b1", 1, 3),
            ev("compute", "forward", "b1", "main", 4, 6), ev("compute", "backward", "b1", "main", 6, 8),
            ev("compute", "backward", "b0", "main", 8, 10), ev("compute", "update", "optimizer.step", "main", 10, 11)]
    a = analyse(1, {0: rank}, {}, {0: 0})
    assert a.predicted_ms == pytest.approx(11.0)
    assert a.exposed_comm_ms == pytest.approx(0.0)
    w = what_if(a)
    assert w["all-reduce ×2"] == pytest.approx(12.0)  # the gather now ends at 5: b1 starts 1 ms late
    assert w["perfect overlap"] == pytest.approx(11.0)


def test_a_reduce_scatter_under_running_compute_gates_nothing() -> None:
    # A GPU's reduce-scatter stream: the next unit's backward runs while the previous one's gradients reduce.
    rank = [ev("compute", "forward", "b0", "main", 0, 2), ev("compute", "backward", "b1", "main", 2, 4),
            comm("reduce-scatter b1", 4, 6), ev("compute", "backward", "b0", "main", 4, 8),
            ev("compute", "update", "optimizer.step", "main", 8, 9)]
    a = analyse(1, {0: rank}, {}, {0: 0})
    assert a.predicted_ms == pytest.approx(9.0)
    assert what_if(a)["all-reduce ×2"] == pytest.approx(9.0)  # b0's backward does not wait for it
    assert not assemble({0: rank}, {}, {0: 0}).collectives[0].gate


def test_a_collective_issued_while_the_lane_waits_for_a_gather_keeps_the_schedule() -> None:
    # The lane idles from 4 to 9 for the gather; a reduce-scatter on its own stream is issued at 5 meanwhile.
    rank = [ev("compute", "forward", "b0", "main", 0, 2), ev("compute", "backward", "b1", "main", 2, 4),
            comm("all-gather b0 (backward)", 4, 9), comm("reduce-scatter b1", 5, 7),
            ev("compute", "backward", "b0", "main", 9, 11), ev("compute", "update", "optimizer.step", "main", 11, 12)]
    dag = assemble({0: rank}, {}, {0: 0})
    runs = sorted((int(a), int(b)) for a, b, k in zip(dag.a, dag.b, dag.kind) if k == 1)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(runs, runs[1:]))  # the lane's runs never overlap
    a = analyse(1, {0: rank}, {}, {0: 0})
    assert a.predicted_ms == pytest.approx(12.0)
    assert what_if(a)["perfect overlap"] == pytest.approx(7.0)


def test_the_screen_names_the_gather_on_the_critical_path() -> None:
    from dagtop.ui.renderables.timeline import timeline_rows

    a = analyse(1, {0: cpu_fsdp_rank()}, {}, {0: -1 * MS})
    critical = timeline_rows(a, width=400, height=10)[-1].cells.plain
    assert "all-gather b1" in critical and "reduce-scatter b0" in critical
    renamed = [e._replace(name=f"bucket {i}") if e.lane == "comm" else e for i, e in enumerate(cpu_fsdp_rank())]
    critical = timeline_rows(analyse(1, {0: renamed}, {}, {0: -1 * MS}), width=400, height=10)[-1].cells.plain
    assert "bucket" not in critical and "all" in critical  # a DDP bucket's number says nothing: "all" ranks
