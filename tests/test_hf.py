"""``instrument.hf.DagtopCallback`` on a real Hugging Face Trainer: a 2-rank DDP job over gloo (tests/jobs/hf_trainer.py,
a tiny GPT-2 built from its config, gradient accumulation) timed and plain; the same in one process, where what the
callback changes on the Trainer can be watched; the copy inside accelerate's loader told from the loads; one warning
for what it cannot time."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from ranks import complete, hellos, report, run_job

from instrument import wire
from instrument.events import SCRIPT
from instrument.ranktracer import NullTracer
from instrument.tracer import Tracer

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from instrument.hf import DagtopCallback, ShardCopies, TimedBatches

STEPS, MICRO = 6, 2
"""Optimizer steps, and micro-batches per step (tests/jobs/hf_trainer.py's gradient accumulation)."""
BLOCKS = ["transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1", "transformer.ln_f", "lm_head"]
"""GPT2LMHeadModel opened up: its transformer's called children, one block per layer, beside the head; not its
dropout, a leaf without parameters."""
LOAD, COPY = ("io", "load", "next"), ("pcie", "h2d", "to_device")


AROUND = {"GPT2LMHeadModel", "transformer"}
"""The modules around the blocks: their own work (the loss, the attention mask) is theirs (tests/test_spans.py)."""


def _names(batch: wire.IterationBatch, phase: str) -> Counter[str]:
    return Counter(e.name for e in batch.events if e.phase == phase and e.name not in AROUND)


def _check_iteration(batch: wire.IterationBatch, where: str) -> None:
    """What every iteration of the job holds: each micro-batch's load, copy, forward and backward per block, then
    the update after the backward and the collectives."""
    tasks = Counter((e.category, e.phase, e.name) for e in batch.events)
    assert tasks[LOAD] == MICRO and tasks[COPY] == MICRO, (where, tasks)
    assert _names(batch, "forward") == {name: MICRO for name in BLOCKS}, where
    assert _names(batch, "backward") == {name: MICRO for name in BLOCKS}, where
    assert tasks[("compute", "update", "optimizer.step")] == 1, where
    loads = [e for e in batch.events if e.phase == "load"]
    forwards = [e for e in batch.events if e.phase == "forward"]
    assert max(e.end_ns for e in loads) <= min(e.start_ns for e in forwards), where  # the step's batches, read ahead
    [update] = [e for e in batch.events if e.phase == "update"]
    done = max(e.end_ns for e in batch.events if e.phase in ("backward", "allreduce"))
    assert update.start_ns >= done, where
    main = sorted((e for e in batch.events if e.lane == "main"), key=lambda e: e.start_ns)
    assert all(a.end_ns <= b.start_ns for a, b in zip(main, main[1:])), f"{where}: tasks overlap on the main lane"


def test_a_trainer_job_is_timed_on_every_rank_and_trains_the_same(
        collector: Any, endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = run_job("hf_trainer.py", "--steps", str(STEPS))
    assert plain.ok, plain.log
    timed = run_job("hf_trainer.py", "--steps", str(STEPS), endpoint=endpoint)
    assert timed.ok, timed.log
    assert "dagtop:" not in timed.log, timed.log  # no warning: nothing unsupported, nothing failed
    assert timed.losses == plain.losses, "dagtop changed the training"  # bit-identical, every micro-batch
    assert sorted(plain.losses) == [0, 1] and all(len(v) == STEPS * MICRO for v in plain.losses.values())
    assert plain.losses[0] != plain.losses[1]  # each rank trains on its own shard

    frames = collector.until_bye(2)
    hello = hellos(frames)
    assert sorted(hello) == [0, 1] and {h.model for h in hello.values()} == {"GPT2LMHeadModel"}
    iterations = complete(frames)
    assert sorted(iterations) == list(range(STEPS))
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            where = f"iteration {it} rank {rank}"
            _check_iteration(batch, where)
            # DDP all-reduces every gradient once per step, in its buckets (after the last micro-batch only);
            # one bucket in iteration 0, several once DDP has rebuilt them at the job's small bucket size.
            buckets = [e for e in batch.events if e.phase == "allreduce" and SCRIPT not in e.name]
            assert len(buckets) >= (2 if it else 1) and all(e.lane == "comm" for e in buckets), where
            assert sum(e.bytes for e in buckets) == 4 * hello[rank].params, where
            # The Trainer gathers the step's token count from every rank: a collective on the training thread, timed
            # as its task and, inside it, as the collective accelerate calls (matched across ranks).
            assert _names(batch, "custom") == {"trainer.num_items_in_batch": 1}, where
            [count] = [e for e in batch.events if e.name == "trainer.num_items_in_batch"]
            gathers = [e for e in batch.events if SCRIPT in e.name]
            assert gathers and all(count.start_ns <= e.start_ns <= e.end_ns <= count.end_ns for e in gathers), where

    summary = report(frames, tmp_path, capsys)
    assert summary["ranks"] == 2 and summary["communication_seen"] is True
    shares = summary["critical_path"]
    assert shares["compute"] > shares["other"] and shares["compute"] > shares["io"] + shares["pcie"], shares


# ---------------------------------------------------------------------------------------------- in one process


class Watch(TrainerCallback):
    """Notes, at every step, which of the Trainer's methods are shadowed on the instance, and the callback's tracer."""

    def __init__(self, trainer_of: list[Trainer], dagtop: DagtopCallback) -> None:
        self.trainer_of, self.dagtop = trainer_of, dagtop
        self.shadowed: list[set[str]] = []
        self.tracers: list[Any] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.shadowed.append(set(vars(self.trainer_of[0])) & {"get_batch_samples", "_prepare_inputs",
                                                               "_get_num_items_in_batch"})
        self.tracers.append(self.dagtop.tracer)


def _trainer(tmp_path: Path, callbacks: list[TrainerCallback]) -> Trainer:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=2, n_head=2, bos_token_id=None,
                        eos_token_id=None)
    tokens = torch.randint(0, 64, (STEPS * MICRO * 2, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), use_cpu=True, per_device_train_batch_size=2,
                             gradient_accumulation_steps=MICRO, max_steps=STEPS, save_strategy="no", report_to="none",
                             disable_tqdm=True, logging_steps=10_000)
    return Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=callbacks)


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DAGTOP_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAGTOP_TELEMETRY", "0")


def test_in_one_process_the_trainer_is_timed_then_left_as_it_was(
        collector: Any, endpoint: str, tmp_path: Path, one_rank: None) -> None:
    dagtop = DagtopCallback(endpoint=endpoint)
    trainer_of: list[Trainer] = []
    watch = Watch(trainer_of, dagtop)
    trainer = _trainer(tmp_path, [dagtop, watch])
    trainer_of.append(trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in caught if "dagtop" in str(w.message)]
    assert watch.shadowed == [{"get_batch_samples", "_prepare_inputs"}] * STEPS  # one rank: no token-count gather
    assert all(isinstance(t, Tracer) for t in watch.tracers)
    assert dagtop.tracer is None and not {"get_batch_samples", "_prepare_inputs"} & set(vars(trainer))
    frames = [wire.decode(raw.payload) for raw in collector.until_bye(1)]
    batches = {f.iteration: f for f in frames if isinstance(f, wire.IterationBatch)}
    assert sorted(batches) == list(range(STEPS))
    for it, batch in batches.items():
        _check_iteration(batch, f"iteration {it}")


def test_with_dagtop_disabled_the_trainer_is_not_touched(
        tmp_path: Path, one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGTOP_DISABLE", "1")
    dagtop = DagtopCallback()
    trainer_of: list[Trainer] = []
    watch = Watch(trainer_of, dagtop)
    trainer = _trainer(tmp_path, [dagtop, watch])
    trainer_of.append(trainer)
    trainer.train()
    assert watch.shadowed == [set()] * STEPS
    assert all(isinstance(t, NullTracer) for t in watch.tracers)


def _begin_training(self: Trainer) -> None:
    """Calls the callbacks' on_train_begin as the Trainer's loop does (``self`` is the Trainer)."""
    self.callback_handler.on_train_begin(self.args, self.state, self.control)


def test_a_setup_it_cannot_time_gets_one_warning_and_training_goes_on(
        tmp_path: Path, one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    dagtop = DagtopCallback(endpoint="tcp://127.0.0.1:1")
    trainer = _trainer(tmp_path, [dagtop])
    monkeypatch.setattr(trainer, "is_deepspeed_enabled", True)  # what accelerate says of a DeepSpeed run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _begin_training(trainer)
    [warning] = [w for w in caught if "dagtop" in str(w.message)]
    assert "DeepSpeed is not supported" in str(warning.message) and "training continues" in str(warning.message)
    assert dagtop.tracer is None and "get_batch_samples" not in vars(trainer)


def test_called_by_no_trainer_it_says_so_and_times_the_model_it_was_handed(one_rank: None) -> None:
    from accelerate.optimizer import AcceleratedOptimizer

    model = torch.nn.Linear(4, 4)
    optimizer = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), device_placement=False)
    dagtop = DagtopCallback(endpoint="tcp://127.0.0.1:1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dagtop.on_train_begin(None, None, None, model=model, optimizer=optimizer)  # type: ignore[arg-type]
    [warning] = [w for w in caught if "dagtop" in str(w.message)]
    assert "found no transformers Trainer" in str(warning.message)
    assert isinstance(dagtop.tracer, Tracer)  # attached through accelerate's optimizer wrapper
    dagtop.on_train_end(None, None, None)  # type: ignore[arg-type]
    assert dagtop.tracer is None


# ---------------------------------------------------------------------------------------------- the loader


def test_the_copy_inside_accelerates_loader_is_told_from_the_loads() -> None:
    """DataLoaderShard copies batch k to the device, then reads batch k+1, in the next() that returns batch k."""
    from accelerate.data_loader import DataLoaderShard

    data = [{"input_ids": torch.arange(8) + i} for i in range(6)]
    loader = DataLoaderShard(data, device=torch.device("cpu"), batch_size=2)
    assert ShardCopies.of(loader) is None  # on the CPU nothing is copied there: not split
    shard = ShardCopies.of(loader, on_cpu=True)
    assert shard is not None
    loader.base_dataloader.__iter__ = shard.wrap_iter(loader.base_dataloader.__iter__)
    recorded: list[tuple[Any, ...]] = []
    batches = list(TimedBatches(iter(loader), lambda *task: recorded.append(task), shard))

    assert [b["input_ids"][:, 0].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]
    # First next(): read batch 0, copy it, read batch 1; then copy k, read k+1; the last: copy only.
    assert [task[0] for task in recorded] == ["io", "pcie", "io", "pcie", "io", "pcie"]
    assert all(task[1:3] == ("h2d", "to_device") and task[5] == 2 * 8 * 8 for task in recorded if task[0] == "pcie")
    assert all(a[4] <= b[3] for a, b in zip(recorded, recorded[1:]))  # in order, never overlapping

    # Another loader (a resumed epoch's, made by skip_first_batches) whose reads the splitter does not see: all io.
    recorded.clear()
    other = DataLoaderShard(data, device=torch.device("cpu"), batch_size=2)
    assert len(list(TimedBatches(iter(other), lambda *task: recorded.append(task), shard))) == 3
    assert [task[0] for task in recorded] == ["io", "io", "io"]
