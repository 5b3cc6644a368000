"""A small MLP under DDP, timed by dagtop, paced and saying what it ran: for the fault tests (a rank killed under
torchrun ``--max-restarts``, a lossy link, the monitor away). Each process writes its pid (``pid-RESTART-RANK``,
RESTART torchrun's restart count or 0) and a line per step to ``steps-RESTART-RANK`` (flushed: a rank killed
mid-run has said every step it finished), in ``JOB_OUT``. Runs ``--steps`` steps of at least ``--step-ms`` each, idles
``--idle-s`` (its frames still on their way may arrive: a closing rank gives them 2 s, and drops what is left), then
leaves."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from common import finish, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import instrument


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--idle-s", type=float, default=0.0)
    args = parser.parse_args()
    rank, _ = start()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    out = Path(os.environ["JOB_OUT"])
    (out / f"pid-{restart}-{rank}").write_text(str(os.getpid()))
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    with open(out / f"steps-{restart}-{rank}", "a", buffering=1) as steps:
        for step in range(args.steps):
            began = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            steps.write(f"{step}\n")
            time.sleep(max(0.0, args.step_ms / 1000 - (time.perf_counter() - began)))
    time.sleep(args.idle_s)
    tracer.close()
    finish()


if __name__ == "__main__":
    main()
