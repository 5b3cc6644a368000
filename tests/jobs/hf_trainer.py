"""A Hugging Face ``Trainer`` run on a tiny GPT-2 built from its config (no download), 2 ranks of DDP over gloo on
CPU, with gradient accumulation; timed by ``instrument.hf.DagtopCallback`` unless ``DAGTOP_DISABLE=1``.

The Trainer starts the process group itself (torchrun's environment) and, with 2 ranks, must wrap the model in
DDP (asserted). Every micro-batch's loss, as each rank's model returned it, goes to ``save_losses``; the time of
each optimizer step (wall, and CPU time of the rank's process) is printed on a ``step_s`` line, for overhead
measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
from common import Losses, save_losses
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from instrument.hf import DagtopCallback

VOCAB, SEQ, MICRO_BATCH, ACCUMULATE = 96, 32, 8, 2
LAYERS = 2
BUCKET_MB = 0.15
"""About 150 kB: the model's 430 kB of gradients go in three buckets, as a real model's would go in several."""


class TokenDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences: the same on every run, for every rank (the Trainer's sampler shards them)."""

    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.tokens = torch.randint(0, VOCAB, (size, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class LossRecorder(TrainerCallback):
    """Keeps the loss of every micro-batch as the model returned it on this rank (no collective, no rounding),
    and the time of every optimizer step, end to end."""

    def __init__(self) -> None:
        self.losses = Losses()
        self.step_ends: list[tuple[float, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_ends.append((time.perf_counter(), time.process_time()))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        def keep(module: Any, inputs: Any, output: Any) -> None:
            if module.training and torch.is_grad_enabled():
                self.losses.append(output.loss.item())

        model.register_forward_hook(keep)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=LAYERS, n_head=2, bos_token_id=None,
                        eos_token_id=None)
    model = GPT2LMHeadModel(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    training = TrainingArguments(
        output_dir=os.path.join(os.environ["JOB_OUT"], "trainer"), use_cpu=True, ddp_backend="gloo",
        per_device_train_batch_size=MICRO_BATCH, gradient_accumulation_steps=ACCUMULATE, max_steps=args.steps,
        learning_rate=1e-3, seed=0, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, logging_steps=10_000, ddp_find_unused_parameters=False,
        ddp_bucket_cap_mb=BUCKET_MB,  # typed int, passed to DDP as is, which takes a float
    )
    recorder = LossRecorder()
    data = TokenDataset(args.steps * ACCUMULATE * MICRO_BATCH * world)
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[recorder, DagtopCallback()])
    trainer.train()
    if world > 1:
        wrapped = trainer.model_wrapped
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel), type(wrapped)
        assert wrapped.module is trainer.model and torch.distributed.get_world_size() == world
    save_losses(recorder.losses)
    ends = recorder.step_ends
    steps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(ends, ends[1:])]  # wall and CPU time of this process
    sys.stdout.flush()  # then the line in one write: the ranks share the log
    os.write(sys.stdout.fileno(), f"step_s {os.environ.get('RANK', '0')} {json.dumps(steps)}\n".encode())
    # Leave without tearing the process group down: in about one run in ten here (plain runs too), the gloo group's
    # destructor, run with the GIL held when main() returns (DDP holds the group), joined its worker thread while
    # that thread waited for the GIL to free a finished all-gather: a hang of torch 2.13, not of the job.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
