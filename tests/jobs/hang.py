"""A small DDP job whose rank 1 hangs once, at a known iteration: ``--hang loader`` sleeps ``--seconds`` in its data
loader (a live rank, still sending heartbeats), ``--hang stop`` stops itself with SIGSTOP (a frozen rank: the test
continues it). Just before, the rank writes ``hang.json`` in JOB_OUT: the iteration and the ``perf_counter_ns``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from common import Losses, finish, save_losses, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import instrument


def batches(rank: int, hang_at: int, how: str, seconds: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(rank)
    step = 0
    while True:
        if rank == 1 and step == hang_at and how == "loader":
            note(step)
            time.sleep(seconds)
        yield torch.randn(32, 64, generator=g), torch.randint(0, 8, (32,), generator=g)
        step += 1


def note(step: int) -> None:
    Path(os.environ["JOB_OUT"], "hang.json").write_text(json.dumps({"iteration": step,
                                                                    "at_ns": time.perf_counter_ns()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", choices=["loader", "stop"], default="loader")
    parser.add_argument("--at", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--steps", type=int, default=18)
    args = parser.parse_args()
    rank, _ = start()
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer)
    losses = Losses()
    data = tracer.loader(batches(rank, args.at, args.hang, args.seconds))
    for step, (x, y) in zip(range(args.steps), data):
        if rank == 1 and step == args.at and args.hang == "stop":
            note(step)
            os.kill(os.getpid(), signal.SIGSTOP)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        time.sleep(0.1)  # a step of ~0.1 s: the stall threshold (5 median iterations) is its floor, 3 s
    tracer.close()
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
