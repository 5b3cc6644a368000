"""A small MLP under DDP (gloo), fed by a DataLoader, run under torch.profiler: each rank writes its Kineto trace
into ``JOB_OUT`` and, when ``DAGTOP_ENDPOINT`` is set, is timed by dagtop at the same time, so the imported trace
and the live recording describe the very same iterations.

``--slow RANK --slow-in io|compute``: that rank's dataset sleeps per sample, or its forward runs a block several
times over (the same result, more work). ``--gzip`` writes ``trace-RANK.json.gz``; ``--stack`` records the Python
stack, which gives the trace its ``nn.Module`` annotations (forward per top-level module).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import time
from pathlib import Path

import torch
from common import Losses, finish, save_losses, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

import instrument

WIDTH, BATCH = 256, 32
IO_SLEEP_S = 0.0015
"""Per sample of the slow rank's dataset: ~50 ms a batch, several times a step's compute."""
COMPUTE_REPEAT = 40
"""The slow rank's middle block runs this many times over: ~20 ms more per step, well clear of the noise."""


class Samples(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, sleep_s: float) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, WIDTH, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


class Block(nn.Module):
    def __init__(self, repeat: int = 1) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        for _ in range(self.repeat - 1):
            y = y + self.fc(x)
        return torch.relu(y / self.repeat if self.repeat > 1 else y)


class Net(nn.Module):
    def __init__(self, repeat: int) -> None:
        super().__init__()
        self.inp = Block()
        self.mid = Block(repeat)
        self.out = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(self.inp(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (after one warm-up step)")
    parser.add_argument("--slow", type=int, default=None, metavar="RANK")
    parser.add_argument("--slow-in", choices=("io", "compute"), default="io")
    parser.add_argument("--gzip", action="store_true")
    parser.add_argument("--stack", action="store_true")
    parser.add_argument("--traces", default=None, help="folder for the traces (default: JOB_OUT)")
    args = parser.parse_args()
    rank, _ = start()
    slow = args.slow == rank
    model = DDP(Net(COMPUTE_REPEAT if slow and args.slow_in == "compute" else 1), bucket_cap_mb=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = Samples(BATCH * (args.steps + 2), IO_SLEEP_S if slow and args.slow_in == "io" else 0.0)
    tracer = instrument.attach(model, optimizer)
    out = Path(args.traces or os.environ["JOB_OUT"])
    trace = out / f"trace-{rank}.json"
    losses = Losses()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=args.steps, repeat=1),
                 with_stack=args.stack, record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
        for x, y in tracer.loader(DataLoader(dataset, batch_size=BATCH)):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            prof.step()
            if len(losses) > args.steps:
                break
    tracer.close()
    if args.gzip:
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
