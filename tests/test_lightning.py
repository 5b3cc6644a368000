"""Lightning: ``DagtopCallback`` on a real 2-rank gloo fit (tests/jobs/lightning_job.py), compared with the same fit
untimed. Every iteration of both ranks holds, in program order, the loader wait, the copy, forward and backward per
block, the collectives and the update; the update begins after the closure's backward (automatic optimization).
In one process: a LightningModule's own ``transfer_batch_to_device`` is still the one Lightning calls beside a
DataModule without one (both are wrapped), it is timed, and the fit ends with nothing left wrapped."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from ranks import complete, hellos, report, run_job
from torch import nn

from instrument import wire
from instrument.events import SCRIPT

L = pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

STEPS, VALIDATE_EVERY = 6, 3
"""As in the job: six steps, validation after the third (so before iteration 3's loader wait)."""
BLOCKS = ["layers.0", "layers.1", "layers.2", "head"]
"""The Regressor's blocks, its ModuleList opened up."""
BATCH_BYTES = 64 * 128 * 4 + 64 * 1 * 4
"""One batch: x (64 × 128) and y (64 × 1), float32."""
FSDP_UNITS = ["layers.0", "layers.1", "layers.2", "Regressor"]
"""fully_shard units: each layer, and the root (named after its class) holding the head."""


def _fit(*args: str, endpoint: str, collector: Any) -> list[Any]:
    """Run the job plain, then timed; check the losses are the same bits; the frames of the timed run."""
    plain = run_job("lightning_job.py", *args)
    assert plain.ok, plain.log
    timed = run_job("lightning_job.py", *args, endpoint=endpoint)
    assert timed.ok, timed.log
    assert "dagtop:" not in timed.log, timed.log  # attached with no warning: every collective is timed
    assert timed.losses == plain.losses and sorted(plain.losses) == [0, 1]
    assert all(len(losses) == STEPS for losses in plain.losses.values())
    return collector.until_bye(2)


def _check_iteration(it: int, rank: int, batch: wire.IterationBatch) -> list[wire.Event]:
    """The tasks of one rank's iteration, in order; returns its collectives."""
    where = f"iteration {it} rank {rank}"
    events = sorted(batch.events, key=lambda e: (e.start_ns, e.end_ns))

    def phase(name: str) -> list[wire.Event]:
        return [e for e in events if e.phase == name]

    loads, copies, forwards, backwards = phase("load"), phase("h2d"), phase("forward"), phase("backward")
    # The Regressor's own work between its blocks is a task of its name (tests/test_spans.py).
    forwards, backwards = ([e for e in p if e.name != "Regressor"] for p in (forwards, backwards))
    collectives, updates, custom = phase("allreduce"), phase("update"), phase("custom")
    # Lightning's own torch.distributed calls (its barriers, its reductions) are collectives of the script's, timed
    # beside DDP's buckets (instrument/collectives.py): checked for what they are, then left out of the rest.
    script = [e for e in collectives if SCRIPT in e.name]
    assert all(e.category == "allreduce" and e.lane == "comm" and e.end_ns >= e.start_ns for e in script), where
    collectives = [e for e in collectives if SCRIPT not in e.name]
    assert [(e.category, e.name, e.lane) for e in loads] == [("io", "next", "main")], where
    assert [(e.category, e.name, e.lane, e.bytes) for e in copies] == [("pcie", "to_device", "main", BATCH_BYTES)]
    assert [(e.category, e.name) for e in forwards] == [("compute", name) for name in BLOCKS], where
    assert [(e.category, e.name) for e in backwards] == [("compute", name) for name in reversed(BLOCKS)], where
    assert collectives and all(e.category == "allreduce" and e.lane == "comm" and e.bytes > 0
                               for e in collectives), where
    assert [(e.category, e.name) for e in updates] == [("compute", "optimizer.step")], where
    # Validation ran between the previous step and this iteration's fetch: named, and not a copy of this one.
    assert [(e.category, e.name) for e in custom] == ([("other", "validation")] if it == VALIDATE_EVERY else [])
    assert all(e.end_ns <= loads[0].start_ns for e in custom), where
    assert loads[0].end_ns <= copies[0].start_ns and copies[0].end_ns <= forwards[0].start_ns, where
    assert forwards[-1].end_ns <= backwards[0].start_ns, where
    # The update is the optimizer's own work: Lightning's closure (forward, backward, collectives) is not in it.
    assert updates[0].start_ns >= max(e.end_ns for e in backwards + collectives), where
    return collectives


def _check_report(frames: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = report(frames, tmp_path, capsys)
    assert summary["ranks"] == 2 and summary["iterations"] == STEPS - 1  # iteration 0 is left out
    assert summary["communication_seen"] is True
    # An update that swallowed the closure contradicted the DAG: the replay was off by 116 % (issue #9).
    assert summary["model_error"] < 0.1, summary
    shares = summary["critical_path"]
    assert shares["compute"] > shares["io"] + shares["pcie"], shares  # in-memory batches, a real model


@pytest.mark.parametrize("optimization", ["automatic", "manual"])
def test_a_ddp_fit_is_timed_task_by_task(optimization: str, collector: Any, endpoint: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    frames = _fit(*(["--manual"] if optimization == "manual" else []), endpoint=endpoint, collector=collector)
    assert {rank: (h.world, h.model) for rank, h in hellos(frames).items()} == {0: (2, "Regressor"),
                                                                                  1: (2, "Regressor")}
    iterations = complete(frames)
    assert sorted(iterations) == list(range(STEPS))
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            buckets = _check_iteration(it, rank, batch)
            assert all(e.name.startswith("bucket ") for e in buckets)
            if it >= 1:  # DDP's rebuilt buckets, small on purpose (bucket_cap_mb)
                assert len(buckets) >= 2, f"iteration {it} rank {rank}"
    _check_report(frames, tmp_path, capsys)


def test_an_fsdp2_fit_times_its_all_gathers_and_reduce_scatters(collector: Any, endpoint: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's ModelParallelStrategy, ``fully_shard`` per layer (its FSDPStrategy, FSDP1, needs a GPU)."""
    frames = _fit("--strategy", "fsdp", endpoint=endpoint, collector=collector)
    iterations = complete(frames)
    assert sorted(iterations) == list(range(STEPS))
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            names = {e.name for e in _check_iteration(it, rank, batch)}
            where = f"iteration {it} rank {rank}"
            assert {f"all-gather {unit}" for unit in FSDP_UNITS} <= names, where
            assert {n for n in names if n.startswith("reduce-scatter")} == {f"reduce-scatter {u}" for u in FSDP_UNITS}
    _check_report(frames, tmp_path, capsys)


@dataclasses.dataclass
class Pair:
    """A batch type of the user's own, moved by their LightningModule's hook."""

    x: torch.Tensor
    y: torch.Tensor


@pytest.mark.filterwarnings("ignore:You have overridden `transfer_batch_to_device`")  # on purpose: the case at stake
def test_in_one_process_the_users_copy_hook_is_timed_and_the_fit_ends_unwrapped(
        collector: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from instrument.lightning import DagtopCallback

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("DAGTOP_TELEMETRY", "0")
    moved: list[int] = []

    class Pairs(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            data = [Pair(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(3)]
            return torch.utils.data.DataLoader(data, batch_size=None)

    class Linear(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 1)

        def training_step(self, batch: Pair, batch_idx: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.head(self.body(batch.x)), batch.y)

        def transfer_batch_to_device(self, batch: Pair, device: torch.device, dataloader_idx: int) -> Pair:
            moved.append(len(moved))
            return Pair(batch.x.to(device), batch.y.to(device))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Joined(L.Callback):
        """Runs after DagtopCallback attached: no iteration is published before the monitor is connected."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            collector.joined()

    dagtop, module, data = DagtopCallback(endpoint=endpoint), Linear(), Pairs()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, callbacks=[dagtop, Joined()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    frames = [wire.decode(raw.payload) for raw in collector.until_bye(1)]

    batches = {f.iteration: f for f in frames if isinstance(f, wire.IterationBatch)}
    assert sorted(batches) == [0, 1, 2] and moved == [0, 1, 2]
    for it, batch in batches.items():
        copies = [(e.category, e.name, e.bytes) for e in batch.events if e.phase == "h2d"]
        assert copies == [("pcie", "to_device", (4 * 8 + 4 * 1) * 4)], it
        assert [e.name for e in batch.events if e.phase == "load"] == ["next"], it
    assert not dagtop.tracer.enabled  # closed at the end of the fit
    assert "transfer_batch_to_device" not in vars(data) and "transfer_batch_to_device" not in vars(module)
    loop = trainer.fit_loop.epoch_loop
    assert "_on_before_fetch" not in vars(loop) and "_on_after_fetch" not in vars(loop)
