"""FSDP on two gloo ranks (tests/jobs/fsdp.py, slow), each job run with and without dagtop: ``fully_shard``'s
all-gathers and reduce-scatters are timed as collectives, per unit, with the forward and backward of each unit;
FSDP1 trains on untimed with one warning. The loss is bit-identical either way. In one process (fast): the timed
comms wrap FSDP's own, and give them back."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ranks import complete, hellos, report, run_job
from torch import nn

from instrument import wire

STEPS = 6
UNITS = ["layers.0", "layers.1", "layers.2"]
"""The fully_shard'ed layers; the root (named after the model's class) holds embed, norm and head."""
ROOT = "Transformer"


def _comm(batch: wire.IterationBatch) -> list[wire.Event]:
    return [e for e in batch.events if e.lane == "comm"]


def _expected(suffix: str = "") -> Counter[str]:
    """One iteration's collectives: every unit gathered for forward and reduced after backward; the layers,
    resharded after forward, gathered again for backward (the root keeps its parameters until backward)."""
    names = [f"all-gather {u}" for u in [ROOT, *UNITS]] + [f"reduce-scatter {u}" for u in [ROOT, *UNITS]]
    names += [f"all-gather {u} (backward)" for u in UNITS]
    return Counter(name + suffix for name in names)


def _run(mode: str, endpoint: str, collector: Any, *args: str) -> tuple[Any, dict[int, dict[int, wire.IterationBatch]],
                                                                        list[Any]]:
    plain = run_job("fsdp.py", "--mode", mode, "--steps", str(STEPS), *args)
    assert plain.ok, plain.log
    timed = run_job("fsdp.py", "--mode", mode, "--steps", str(STEPS), *args, endpoint=endpoint)
    assert timed.ok, timed.log
    assert timed.losses == plain.losses and len(plain.losses[0]) >= STEPS  # bit-identical, every rank
    frames = collector.until_bye(2)
    iterations = complete(frames)
    assert sorted(iterations) == list(range(STEPS))  # every iteration, from both ranks
    return timed, iterations, frames


@pytest.mark.slow
def test_fully_shard_collectives_are_timed_per_unit(collector: Any, endpoint: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    timed, iterations, frames = _run("fsdp2", endpoint, collector)
    assert "dagtop:" not in timed.log  # no warning: nothing left untimed, nothing disabled
    said = hellos(frames)
    assert set(said) == {0, 1} and {h.model for h in said.values()} == {"Transformer"}  # not fully_shard's FSDP…
    assert all(h.units.startswith("6 blocks: embed, layers.0…2") for h in said.values()), said[0].units
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            comm = _comm(batch)
            assert Counter(e.name for e in comm) == _expected(), (it, rank)  # unique, and the same on both ranks
            assert all(e.category == "allreduce" and e.phase == "allreduce" and e.bytes > 0 for e in comm)
            assert all(e.end_ns >= e.start_ns for e in comm)
            for phase in ("forward", "backward"):
                names = {e.name for e in batch.events if e.phase == phase}
                assert set(UNITS) <= names, (it, rank, phase)  # one block per fully_shard'ed layer
    # Bytes: the unsharded size, the same for a unit's gathers and its reduce-scatter, and on both ranks.
    sizes = {(r, e.name.split(" ")[1]): e.bytes for r, b in iterations[2].items() for e in _comm(b)}
    assert len(set(sizes.values())) == 2  # the three identical layers, and the root
    summary = report(frames, tmp_path, capsys)
    assert summary["ranks"] == 2 and summary["communication_seen"] is True
    # The gathers are on the path (4-6 % of it seen on a loaded VM: their share is small, only its presence is sure)
    assert summary["critical_path"]["allreduce"] > 0 and summary["critical_path"]["compute"] > 0.25
    assert {x["change"] for x in summary["what_if"]} >= {"all-reduce ×2", "perfect overlap"}
    faster = next(x for x in summary["what_if"] if x["change"] == "perfect overlap")
    assert faster["iteration_ms"] < summary["predicted_iteration_ms"]  # the gathers hold the compute up
    named = {c["name"] for c in summary["collectives"]}
    assert named == set(_expected())


@pytest.mark.slow
def test_micro_batches_an_async_prefetch_and_hsdp_keep_every_collective(collector: Any, endpoint: str) -> None:
    # HSDP on two ranks: one replica of two shards, so each rank all-reduces across a group of its own.
    _, iterations, _ = _run("accumulate", endpoint, collector, "--micro", "2", "--prefetch", "--hsdp")
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            # Each micro-batch gathers and reduces every unit: the second ones are numbered, so names stay unique.
            reduced = Counter(f"all-reduce {u} [ranks {rank}]" for u in [ROOT, *UNITS])
            expected = _expected() + reduced
            assert Counter(e.name for e in _comm(batch)) == expected + Counter(n + " #2" for n in expected), (it, rank)
            assert all(e.bytes > 0 for e in _comm(batch))
            # The prefetched gather (async: timed to its future's completion) is the first collective of each step.
            assert min(_comm(batch), key=lambda e: e.start_ns).name == "all-gather layers.0"


@pytest.mark.slow
def test_fsdp1_trains_untimed_with_one_warning(collector: Any, endpoint: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    timed, iterations, frames = _run("fsdp1", endpoint, collector)
    warned = [line for line in timed.log.splitlines() if "dagtop:" in line]
    assert len(warned) == 2 and all("FSDP1" in line for line in warned)  # one per rank
    assert all(not _comm(b) for ranks in iterations.values() for b in ranks.values())
    assert report(frames, tmp_path, capsys)["communication_seen"] is False


# ---------------------------------------------------------------------------------------------- in one process


@pytest.fixture
def one_rank() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _hsdp_model() -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def test_the_timed_comms_wrap_fsdps_own_and_give_them_back(one_rank: None) -> None:
    import torch.distributed as dist

    from instrument.fsdp import ShardTimer, TimedAllGather, TimedAllReduce, TimedReduceScatter
    from instrument.probe import Probe, Switch

    model = _hsdp_model()
    reduced: list[torch.Tensor] = []
    model[1].set_all_reduce_hook(reduced.append)  # the user's own hook
    group = model[1]._get_fsdp_state()._fsdp_param_groups[0]
    own = (group._all_gather_comm, group._reduce_scatter_comm)
    events: list[tuple[Any, ...]] = []
    iteration = [0]
    probe = Probe(events.append, time.perf_counter_ns, "comm", Switch(), pytest.fail)
    shards = ShardTimer.of([model], probe, lambda: iteration[0])
    assert shards is not None and shards.units == 2 and not shards.skipped  # the root holds no parameters
    gather, scatter, hook = group._all_gather_comm, group._reduce_scatter_comm, group._all_reduce_hook
    assert isinstance(gather, TimedAllGather) and isinstance(scatter, TimedReduceScatter)
    assert isinstance(hook, TimedAllReduce) and hook.user_hook is not None

    out, shard = torch.zeros(8), torch.ones(8)
    for _ in range(2):
        gather(output_tensor=out, input_tensor=shard, group=dist.group.WORLD)
    scatter(output_tensor=shard, input_tensor=out, group=dist.group.WORLD, op=dist.ReduceOp.SUM)
    hook(shard)  # FSDP calls it right after its all-reduce
    iteration[0] = 1
    gather(output_tensor=out, input_tensor=shard, group=dist.group.WORLD)
    assert [(e[0], e[2], e[3], e[6]) for e in events] == [
        ("allreduce", "all-gather 1", "comm", 32), ("allreduce", "all-gather 1 #2", "comm", 32),
        ("allreduce", "reduce-scatter 1", "comm", 32), ("allreduce", "all-reduce 1", "comm", 32),
        ("allreduce", "all-gather 1", "comm", 32)]  # a new iteration counts afresh
    assert all(e[4] <= e[5] for e in events) and events[3][4] == events[2][5]  # the all-reduce follows the scatter
    assert reduced == [shard]  # the user's hook still ran
    assert torch.equal(out, torch.ones(8))  # the collective itself ran (one rank: the gather is the shard)

    # FSDP's own switches still work after attach: they replace the timed comm, as they would FSDP's default.
    model[0].set_allocate_memory_from_process_group_for_comm(True)
    shards.remove()
    assert (group._all_gather_comm, group._reduce_scatter_comm) == own
    assert group._all_reduce_hook == reduced.append
    assert type(model[0]._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm).__name__ == \
        "ProcessGroupAllocAllGather"


def test_a_failing_sink_disables_timing_never_training(one_rank: None) -> None:
    import torch.distributed as dist

    from instrument.fsdp import ShardTimer
    from instrument.probe import Probe, Switch

    model = _hsdp_model()
    failures: list[BaseException] = []

    def broken(event: tuple[Any, ...]) -> None:
        raise RuntimeError("the sink broke")

    ShardTimer.of([model], Probe(broken, time.perf_counter_ns, "comm", Switch(), failures.append), lambda: 0)
    gather = model[0]._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm
    out = torch.zeros(8)
    gather(output_tensor=out, input_tensor=torch.ones(8), group=dist.group.WORLD)  # no exception here
    assert torch.equal(out, torch.ones(8)) and [str(f) for f in failures] == ["the sink broke"]
