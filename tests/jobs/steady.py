"""A balanced DDP job (every rank alike: the noise is the machine's) that trains for ``--seconds``, for the live
screen to be watched on; losses saved as the other jobs do.

Its steps are tens of ms, as a real job's are at the least, not a few: a monitor starved of CPU on a loaded 2-core
machine fell behind a 54-steps-a-second job, and what it then showed was its own lag, not the job."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from common import Losses, finish, save_losses, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import instrument

BATCH = 128
"""Samples per step."""
WIDTH = 1024
"""Hidden width: 5 MB of gradients a step, so that all-reduce and compute share the critical path."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=80.0)
    args = parser.parse_args()
    rank, _ = start()
    model = DDP(nn.Sequential(nn.Linear(256, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer)
    g = torch.Generator().manual_seed(rank)

    def batches():  # type: ignore[no-untyped-def]
        while True:
            yield torch.randn(BATCH, 256, generator=g), torch.randint(0, 10, (BATCH,), generator=g)

    losses = Losses()
    stop = torch.zeros(1)
    for x, y in tracer.loader(batches()):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if rank == 0 and time.perf_counter() - losses.times[0] > args.seconds:
            stop.fill_(1)
        dist.broadcast(stop, src=0)  # every rank stops at the same step
        if stop.item():
            break
    tracer.close()
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
