"""One of the kinds of job of benchmarks/job_kinds.py (``--kind``: compute-heavy CNN, communication-heavy
MLP, loader-bound job with DataLoader workers, small transformer, many small layers with a bucket each), trained
under DDP for ``--steps`` steps with SGD and momentum; timed by dagtop unless ``DAGTOP_DISABLE=1``. The losses go to ``JOB_OUT`` (common.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import Losses, finish, save_losses, start
from torch import nn

import instrument

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import job_kinds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True, choices=job_kinds.KINDS)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    rank, _ = start()
    job = job_kinds.make(args.kind, rank)
    model = nn.parallel.DistributedDataParallel(job.model, **job.ddp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tracer = instrument.attach(model, optimizer)
    losses = Losses()
    for x, y in tracer.loader(job.batches(args.steps)):
        loss = job.loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    tracer.close()
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
