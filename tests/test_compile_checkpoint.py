"""torch.compile in either order or per block, and activation checkpointing (reentrant or not, static graph DDP),
as real 2-rank gloo jobs (tests/jobs/compiled.py, tests/jobs/checkpointed.py), each compared with the same job
untimed: the losses are bit-identical, Dynamo compiles the same program, every iteration holds each block's
forward and backward once, and the report says the job is compute."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ranks import JobRun, complete, report, run_job

from instrument import wire

pytestmark = pytest.mark.slow

STEPS = 6


MODELS = {"Transformer", "Stack"}
"""A model's own work between its units is a task of its name (tests/test_spans.py)."""


def _names(batch: wire.IterationBatch, phase: str, units: list[str]) -> list[str]:
    """The names of ``phase``'s tasks of ``units`` in order; any other must be the model's own work."""
    names = [e.name for e in sorted(batch.events, key=lambda e: e.start_ns) if e.phase == phase]
    assert set(names) - set(units) <= MODELS, names
    return [n for n in names if n in units]


def _check_iterations(frames: list[Any], units: list[str]) -> dict[int, dict[int, wire.IterationBatch]]:
    """Every iteration on both ranks: each unit's forward in order and its backward once, buckets, one update,
    and no two tasks of the training thread overlapping."""
    iterations = complete(frames)
    assert sorted(iterations) == list(range(STEPS))
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            where = f"iteration {it} rank {rank}"
            assert _names(batch, "forward", units) == units, where
            assert Counter(_names(batch, "backward", units)) == Counter(units), where
            assert _names(batch, "update", ["optimizer.step"]) == ["optimizer.step"], where
            allreduce = [e for e in batch.events if e.phase == "allreduce"]
            assert allreduce and all(e.bytes > 0 and e.lane == "comm" for e in allreduce), where
            main = sorted((e for e in batch.events if e.lane == "main"), key=lambda e: e.start_ns)
            for a, b in zip(main, main[1:]):
                assert a.end_ns <= b.start_ns, f"{where}: {a.phase} {a.name} overlaps {b.phase} {b.name}"
    return iterations


def _backward_is_timed(iterations: dict[int, dict[int, wire.IterationBatch]]) -> None:
    """The backward pass is the units' backwards end to end: the recompute of a checkpointed layer is in its
    layer's backward, not in a gap between two (untimed, it would be half the backward pass or more)."""
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            backward = [e for e in batch.events if e.phase == "backward" and e.name not in MODELS]
            span = max(e.end_ns for e in backward) - min(e.start_ns for e in backward)
            covered = sum(e.duration_ns for e in backward)  # they do not overlap (checked above)
            assert covered >= 0.5 * span, f"iteration {it} rank {rank}: {covered / span:.0%} of the backward timed"


def _compute_dominates(frames: list[Any], tmp_path: Path, capsys: Any, *, all_compute: bool) -> None:
    """Untimed, the blocks' time would be "other" (75 % seen, compute 12 %). The checkpointed jobs are all compute
    (81-91 % seen); the compiled ones are small enough that their all-reduce weighs as much (37-55 % compute,
    8-10 % other, 37-53 % all-reduce seen) and a loaded VM's waits for a core ("other") more: compute over
    other is what holds there."""
    summary = report(frames, tmp_path, capsys)
    assert summary["communication_seen"] is True
    shares = summary["critical_path"]
    if all_compute:
        assert summary["bottleneck"] == "compute" and shares["compute"] > 2 * shares["other"], shares
    else:
        assert shares["compute"] > shares["other"], shares


def _twice(script: str, *args: str, endpoint: str) -> tuple[JobRun, JobRun]:
    plain = run_job(script, *args)
    assert plain.ok, plain.log
    timed = run_job(script, *args, endpoint=endpoint)
    assert timed.ok, timed.log
    assert timed.losses == plain.losses and len(plain.losses[0]) == STEPS  # bit-identical, every rank
    assert "dagtop:" not in timed.log, timed.log  # no warning from the shim
    return plain, timed


# ---------------------------------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize(("order", "units"), [
    ("ddp_compile", ["Transformer"]),  # a compiled model is one unit, timed from outside its graph
    ("compile_ddp", ["Transformer"]),
    ("blocks", ["embed", "layers.0", "layers.1", "head"]),  # each compiled layer timed around its compiled call
])
def test_a_compiled_job_is_timed_without_changing_what_dynamo_compiles(
        order: str, units: list[str], endpoint: str, collector: Any, tmp_path: Path, capsys: Any) -> None:
    counts = {kind: tmp_path / kind for kind in ("plain", "timed")}
    for folder in counts.values():
        folder.mkdir()
    plain = run_job("compiled.py", "--order", order, "--steps", str(STEPS), "--counts", str(counts["plain"]))
    assert plain.ok, plain.log
    timed = run_job("compiled.py", "--order", order, "--steps", str(STEPS), "--counts", str(counts["timed"]),
                    endpoint=endpoint)
    assert timed.ok, timed.log
    assert timed.losses == plain.losses and len(plain.losses[0]) == STEPS
    assert "dagtop:" not in timed.log, timed.log
    for rank in (0, 1):
        without, with_dagtop = (json.loads((counts[k] / f"dynamo-{rank}.json").read_text()) for k in counts)
        assert with_dagtop == without, f"rank {rank}: Dynamo compiled another program under dagtop"
        assert without["graphs"] >= 1 and not with_dagtop["dynamo_warnings"]
    frames = collector.until_bye(2)
    _check_iterations(frames, units)
    decoded = [f for f in map(wire.decode, (raw.payload for raw in frames)) if isinstance(f, wire.Buckets)]
    maps = {f.rank: f.buckets for f in decoded}
    assert set(maps) == {0, 1}
    # CPU ranks time DDP's copies of the gradients into its buckets and back (what no_sync saves).
    assert all(f.copy_ns > 0 and f.add_ns > 0 for f in decoded)
    for buckets in maps.values():  # named as in the model, never through the compiled wrapper (`_orig_mod.`)
        assert "head.weight" in {name for b in buckets for name in b.parameters}
    _compute_dominates(frames, tmp_path, capsys, all_compute=False)


# ---------------------------------------------------------------------------------------------- checkpointing

LAYERS = ["embed", "layers.0", "layers.1", "layers.2", "head"]


def test_reentrant_checkpointing_under_static_graph_ddp_times_each_layer_and_follows_the_rebuilt_buckets(
        endpoint: str, collector: Any, tmp_path: Path, capsys: Any) -> None:
    """The layers' forwards run under no_grad and again inside backward: each layer has its forward, and its
    backward holds its recompute. Static-graph DDP rebuilds its buckets after iteration 1: the map follows."""
    _twice("checkpointed.py", "--checkpoint", "reentrant", "--static-graph", "--steps", str(STEPS),
           endpoint=endpoint)
    frames = collector.until_bye(2)
    iterations = _check_iterations(frames, LAYERS)
    _backward_is_timed(iterations)
    maps = [f for f in map(wire.decode, (raw.payload for raw in frames)) if isinstance(f, wire.Buckets)]
    for rank in (0, 1):
        last = [m for m in maps if m.rank == rank][-1]
        sizes = {f"bucket {b.index}": b.bytes for b in last.buckets}
        for it in range(2, STEPS):  # rebuilt after iteration 1: from iteration 2 on, the buckets of the last map
            seen = {e.name: e.bytes for e in iterations[it][rank].events if e.phase == "allreduce"}
            assert seen == sizes, (it, rank, seen, sizes)
        names = [p for b in last.buckets for p in b.parameters]
        assert sorted(names) == sorted(set(names)) and "module.head.weight" not in names and "head.weight" in names
    _compute_dominates(frames, tmp_path, capsys, all_compute=True)


def test_non_reentrant_checkpointing_keeps_one_forward_and_one_backward_per_layer(
        endpoint: str, collector: Any, tmp_path: Path, capsys: Any) -> None:
    _twice("checkpointed.py", "--checkpoint", "nonreentrant", "--steps", str(STEPS), endpoint=endpoint)
    frames = collector.until_bye(2)
    _backward_is_timed(_check_iterations(frames, LAYERS))
    _compute_dominates(frames, tmp_path, capsys, all_compute=True)
