"""A small LightningModule trained by ``L.Trainer`` on 2 CPU ranks (gloo), timed by ``DagtopCallback`` unless the
job runs plain (``DAGTOP_DISABLE=1``: the callback's tracer is the no-op one, so both runs take the same path).
Validation runs once inside the fit, after step ``VALIDATE_EVERY``.

``--strategy``: ``ddp`` (default: DDPStrategy, small buckets so that there are several) or ``fsdp``
(ModelParallelStrategy: ``fully_shard`` per layer, FSDP2; Lightning's FSDPStrategy is FSDP1 and needs a GPU).
``--manual``: manual optimization (``self.optimizers()``, ``manual_backward``, ``opt.step()``) instead of
Lightning's default, where the optimizer's ``step(closure)`` runs forward, backward and the all-reduce inside the
closure.

The ranks are started by tests/ranks.py with torchrun's environment; ``LOCAL_RANK`` being set tells Lightning the
processes were created outside it, so it joins them rather than spawning its own.
"""

from __future__ import annotations

import argparse
import warnings

import lightning as L
import torch
from common import Losses, finish, save_losses
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from instrument.lightning import DagtopCallback

WIDTH, BATCH, STEPS = 128, 64, 6
VALIDATE_EVERY = 3
"""Validation runs inside the fit after this many steps: its copies and forwards belong to no training iteration."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Regressor(L.LightningModule):
    def __init__(self, manual: bool, fsdp: bool) -> None:
        super().__init__()
        self.fsdp = fsdp
        self.automatic_optimization = not manual
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)
        self.losses = Losses()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_model(self) -> None:
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(self, mesh=mesh)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def dataset(steps: int = STEPS) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(2 * BATCH * steps, WIDTH, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--manual", action="store_true")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread per rank: two ranks share two cores
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(0, verbose=False)
    strategy: Strategy = DDPStrategy(process_group_backend="gloo", bucket_cap_mb=0.05)
    if args.strategy == "fsdp":
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo")
    model = Regressor(manual=args.manual, fsdp=args.strategy == "fsdp")
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=strategy, max_steps=args.steps,
                        callbacks=[DagtopCallback()], deterministic=True, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, val_check_interval=VALIDATE_EVERY, limit_val_batches=2)
    trainer.fit(model, DataLoader(dataset(args.steps), batch_size=BATCH), DataLoader(dataset(), batch_size=BATCH))
    save_losses(model.losses)
    # Leave at once (the callback has said bye): torch 2.13's gloo aborted about one exit in a few dozen here,
    # plain runs too ("terminate called without an active exception"), tearing down its threads.
    finish()


if __name__ == "__main__":
    main()
