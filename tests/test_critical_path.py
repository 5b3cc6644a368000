"""Hand-built iterations whose critical path, exposed communication and straggler are known by hand."""

from __future__ import annotations

import networkx as nx
import pytest

from dagtop.model.analysis import analyse
from dagtop.model.dag import assemble
from dagtop.model.snapshot import IterationAnalysis
from instrument.wire import Event

MS = 1_000_000


def ev(category: str, phase: str, name: str, lane: str, start_ms: float, end_ms: float, nbytes: int = 0) -> Event:
    return Event(category, phase, name, lane, int(start_ms * MS), int(end_ms * MS), nbytes)


def serial_rank(io: float = 2.0, fwd: tuple[float, ...] = (1, 2, 3), bwd: tuple[float, ...] = (3, 2, 1),
                comm: float = 4.0, update: float = 1.0, t0: float = 0.0) -> list[Event]:
    """io, copy, forward, backward, then one all-reduce after the whole backward, then the update; no gaps."""
    t = t0
    out = [ev("io", "load", "next", "main", t, t + io)]
    t += io
    out.append(ev("pcie", "h2d", "to_device", "main", t, t + 0.5))
    t += 0.5
    for i, d in enumerate(fwd):
        out.append(ev("compute", "forward", f"b{i}", "main", t, t + d))
        t += d
    for i, d in enumerate(bwd):
        out.append(ev("compute", "backward", f"b{len(bwd) - 1 - i}", "main", t, t + d))
        t += d
    out.append(ev("allreduce", "allreduce", "bucket 0", "comm", t, t + comm, 1000))
    t += comm
    out.append(ev("compute", "update", "optimizer.step", "main", t, t + update))
    return out


def path_ms(a: IterationAnalysis) -> float:
    return sum(s.duration_ms for s in a.critical_path)


def test_fully_serial_path_is_every_task_in_order() -> None:
    a = analyse(1, {0: serial_rank()}, {}, {0: 0})
    total = 2 + 0.5 + 6 + 6 + 4 + 1
    assert a.measured_ms == pytest.approx(total)
    assert a.predicted_ms == pytest.approx(total)
    assert path_ms(a) == pytest.approx(total)
    names = [s.name for s in a.critical_path]
    assert names == ["next", "to_device", "b0", "b1", "b2", "b2", "b1", "b0", "bucket 0", "optimizer.step"]
    assert a.shares["compute"] == pytest.approx(13 / total)
    assert a.shares["allreduce"] == pytest.approx(4 / total)
    assert sum(a.shares.values()) == pytest.approx(1.0)
    assert a.bottleneck == "compute"
    assert a.exposed_comm_ms == pytest.approx(4.0)
    assert a.overlap_ratio == pytest.approx(0.0)
    w = {x.change: x.iteration_ms for x in a.what_if}
    assert w["all-reduce ×0.5"] == pytest.approx(total - 2)
    assert w["all-reduce ×2"] == pytest.approx(total + 4)
    assert w["perfect overlap"] == pytest.approx(total - 4)
    assert w["I/O hidden"] == pytest.approx(total - 2)


def wfbp_rank(tb: list[float], tc: list[float], update: float = 1.0) -> list[Event]:
    """Backward of layers L..1 (tb[l-1] for layer l), each layer its own bucket, per the seed paper's WFBP."""
    layers = len(tb)
    tb_start = {layers: 0.0}
    for layer in range(layers - 1, 0, -1):
        tb_start[layer] = tb_start[layer + 1] + tb[layer]
    tc_start = {layers: tb_start[layers] + tb[layers - 1]}
    for layer in range(layers - 1, 0, -1):
        tc_start[layer] = max(tc_start[layer + 1] + tc[layer], tb_start[layer] + tb[layer - 1])
    out = [ev("compute", "forward", "f", "main", -5.0, 0.0)]
    for layer in range(layers, 0, -1):
        out.append(ev("compute", "backward", f"L{layer}", "main", tb_start[layer], tb_start[layer] + tb[layer - 1]))
        # The bucket is ready when the layer's backward ends; the comm hook is called then.
        out.append(ev("allreduce", "allreduce", f"bucket {layers - layer}", "comm",
                      tb_start[layer] + tb[layer - 1], tc_start[layer] + tc[layer - 1], 1000 * layer))
    end = max(tc_start[1] + tc[0], tb_start[1] + tb[0])
    out.append(ev("compute", "update", "optimizer.step", "main", end, end + update))
    return out


@pytest.mark.parametrize(
    ("tb", "tc"),
    [([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]),  # comm hidden except the last bucket
     ([1.0, 1.0, 1.0], [3.0, 3.0, 3.0]),  # comm-bound: the channel queues up
     ([2.0, 0.5, 4.0], [1.0, 5.0, 0.2])],
)
def test_wfbp_recurrence_and_exposed_comm(tb: list[float], tc: list[float]) -> None:
    layers = len(tb)
    tb_start = {layers: 0.0}
    for layer in range(layers - 1, 0, -1):
        tb_start[layer] = tb_start[layer + 1] + tb[layer]
    tc_start = {layers: tb_start[layers] + tb[layers - 1]}
    for layer in range(layers - 1, 0, -1):
        tc_start[layer] = max(tc_start[layer + 1] + tc[layer], tb_start[layer] + tb[layer - 1])
    exposed = max(tc_start[1] + tc[0] - (tb_start[1] + tb[0]), 0.0)
    a = analyse(1, {0: wfbp_rank(tb, tc), 1: wfbp_rank(tb, tc)}, {}, {0: -5 * MS, 1: -5 * MS})
    assert a.exposed_comm_ms == pytest.approx(exposed, abs=1e-6)
    assert a.measured_ms == pytest.approx(5 + tb_start[1] + tb[0] + exposed + 1.0)
    assert a.predicted_ms == pytest.approx(a.measured_ms)
    starts = {c.name: c.start_ns / MS for c in a.collectives}
    for layer in range(1, layers + 1):
        assert starts[f"bucket {layers - layer}"] == pytest.approx(tc_start[layer])
    assert a.straggler is None  # identical ranks


def test_straggler_rank_gates_the_allreduce_and_the_path_jumps_to_it() -> None:
    fast = serial_rank(io=2.0, comm=14.0)  # its all-reduce span includes waiting for rank 1
    slow = serial_rank(io=12.0, comm=4.0)
    a = analyse(1, {0: fast, 1: slow}, {}, {0: 0, 1: 0})
    coll = a.collectives[0]
    assert coll.gating_rank == 1
    assert coll.duration_ms == pytest.approx(4.0)
    before = [s for s in a.critical_path if s.category != "allreduce" and s.name != "optimizer.step"]
    assert {s.rank for s in before} == {1}
    assert a.critical_path[0].name == "next" and a.critical_path[0].duration_ms == pytest.approx(12.0)
    assert a.straggler is not None
    assert (a.straggler.rank, a.straggler.category) == (1, "io")
    assert a.straggler.excess_ms == pytest.approx(10.0)
    # One iteration is no evidence: the rows' straggler mark is the steady verdict's (dagtop.model.straggler).
    assert [r.straggler for r in a.per_rank] == [False, False]
    # Both ranks take the same wall time; the straggler shows in its work: 24.5 ms busy against 14.5 ms. Each
    # rank against the other's: the straggler's Δ busy is the figure its verdict gives, not half of it.
    assert [r.iteration_ms for r in a.per_rank] == pytest.approx([a.measured_ms] * 2)
    assert [r.deviation_ms for r in a.per_rank] == pytest.approx([-10.0, 10.0])
    assert a.straggler.busy_excess_ms == pytest.approx(10.0)
    assert [r.allreduce_ms for r in a.per_rank] == pytest.approx([14.0, 4.0])
    assert not any(w.change == "straggler at median" for w in a.what_if)  # no straggler named yet: nothing to fix
    # Once the steady verdict names rank 1 (io), the next iteration replays its io brought to rank 0's.
    b = analyse(2, {0: fast, 1: slow}, {}, {0: 0, 1: 0}, suspect=(1, "io"))
    [fix] = [x for x in b.what_if if x.change == "straggler at median"]
    assert fix.rank == 1
    assert fix.iteration_ms == pytest.approx(b.measured_ms - 10.0)


def test_a_ranks_all_reduce_time_counts_concurrent_buckets_once() -> None:
    events = serial_rank(comm=10.0)  # bucket 0 in flight over [14.5, 24.5] ms
    events.append(ev("allreduce", "allreduce", "bucket 1", "comm", 20.5, 27.5, 1000))
    a = analyse(1, {0: events}, {}, {0: 0})
    assert a.per_rank[0].allreduce_ms == pytest.approx(13.0)  # [14.5, 27.5], not 10 + 7


def test_no_straggler_below_the_threshold() -> None:
    a = analyse(1, {0: serial_rank(io=2.0, comm=4.2), 1: serial_rank(io=2.2, comm=4.0)}, {}, {0: 0, 1: 0})
    assert a.straggler is None
    assert not any(w.change == "straggler at median" for w in a.what_if)


def test_bucket_ready_inside_a_block_splits_it_honestly() -> None:
    events = [
        ev("compute", "forward", "f", "main", 0, 2),
        ev("compute", "backward", "big", "main", 2, 12),  # the bucket is ready 3 ms into it
        ev("allreduce", "allreduce", "bucket 0", "comm", 5, 25, 10),
        ev("compute", "update", "optimizer.step", "main", 25, 26),
    ]
    a = analyse(1, {0: events}, {}, {0: 0})
    parts = [(s.name, round(s.duration_ms, 6)) for s in a.critical_path]
    assert parts == [("f", 2.0), ("big", 3.0), ("bucket 0", 20.0), ("optimizer.step", 1.0)]
    w = {x.change: x.iteration_ms for x in a.what_if}
    assert w["perfect overlap"] == pytest.approx(13.0)  # the rest of the backward, then the update


def test_replay_matches_networkx_longest_path() -> None:
    dag = assemble({0: serial_rank(io=2.0, comm=14.0), 1: serial_rank(io=12.0, comm=4.0)}, {}, {0: 0, 1: 0})
    g = dag.to_networkx()
    # Node weight on the edges into it; origins start from a common source at their base time.
    h = nx.DiGraph()
    for u, v, data in g.edges(data=True):
        h.add_edge(u, v, w=data["lat"] + g.nodes[v]["weight"])
    for v, data in g.nodes(data=True):
        if data["base"] is not None:
            h.add_edge("source", v, w=data["base"])
    longest = nx.dag_longest_path_length(h, weight="w")
    a = analyse(1, {0: serial_rank(io=2.0, comm=14.0), 1: serial_rank(io=12.0, comm=4.0)}, {}, {0: 0, 1: 0})
    assert longest / MS == pytest.approx(a.predicted_ms)
