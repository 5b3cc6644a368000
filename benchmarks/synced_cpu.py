"""How much slower a synced step's own CPU work runs than the same step's under ``no_sync``, phase by phase.

    torchrun --standalone --nproc-per-node 2 benchmarks/synced_cpu.py [--rounds 20] [--bucket-view]

One 2-rank gloo job, no dagtop (benchmarks/advice_jobs.py's MLP of 41 small layers): synced steps and steps under
``no_sync`` take turns every 5 steps (the first of each run of 5 not counted). Each rank prints, per phase (the
loader's ``next()``, the forward with the loss, ``backward()``, the optimizer's step with ``zero_grad``), the median
wall time and the training thread's CPU time (``time.thread_time_ns``).

What it is for: gradient accumulation's advice prices a micro-batch under ``no_sync`` from a synced step's CPU time
(dagtop/model/volume.py). Where a synced step's own CPU work is slower than under ``no_sync`` even in phases no
collective runs in, no measurement of synced steps shows it, and the advice under-predicts the gain.

Measured (2026-11-28, this 2-core VM, load 1.0-1.4), rank 0, synced against no_sync, wall/CPU ms: forward
3.34/3.33 against 2.76/2.75, backward 15.97/6.96 against 3.48/3.46, step 1.54/1.53 against 1.11/1.11 (rank 1
alike); with ``--bucket-view`` (DDP copies nothing): forward 3.41/3.38 against 2.74/2.73, backward 14.82/5.24
against 3.46/3.45, step 1.46/1.46 against 1.11/1.10. The forward's and the update's CPU time are 21-24 % and
33-38 % more in a synced step, with no collective in flight, with or without DDP's copies; the backward's own
work (its CPU time less the copies, timed by the shim at ~2.2 ms) about 1.3-1.8 ms more.
With one rank (``--nproc-per-node 1``: no wait) the forward and the update are as fast synced as not (2.73 against
2.66, 1.03 against 1.02 ms): what two ranks add is the wait, and a pause alone does it (benchmarks/pause_cpu.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import advice_jobs

PHASES = ("load", "forward", "backward", "step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True")
    extra = parser.parse_args()
    args = argparse.Namespace(job="mlp", width=1024, depth=8, widths=advice_jobs.SMALL_LAYERS, batch=32, seq=64,
                              vocab=4096, io_ms=1.0, workers=0, bucket_cap=None, granularity="block")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ddp = torch.nn.parallel.DistributedDataParallel(advice_jobs.model_of(args),
                                                    gradient_as_bucket_view=extra.bucket_view)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    batches = advice_jobs.forever(advice_jobs.loader_of(args, 0))
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    times: dict[bool, dict[str, list[tuple[int, int]]]] = {s: {p: [] for p in PHASES} for s in (True, False)}

    def step(synced: bool, keep: bool) -> None:
        marks = [(wall(), cpu())]
        x, y = next(batches)
        marks.append((wall(), cpu()))
        with contextlib.nullcontext() if synced else ddp.no_sync():
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            marks.append((wall(), cpu()))
            loss.backward()
        marks.append((wall(), cpu()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append((wall(), cpu()))
        if keep:
            for phase, (w0, c0), (w1, c1) in zip(PHASES, marks, marks[1:]):
                times[synced][phase].append((w1 - w0, c1 - c0))

    for _ in range(5):  # warm-up: DDP rebuilds its buckets after the first step
        step(True, False)
        step(False, False)
    for r in range(extra.rounds):
        for synced in (True, False) if r % 2 else (False, True):
            for s in range(5):
                step(synced, s > 0)
    for synced in (True, False):
        parts = ", ".join(f"{p} {statistics.median(w for w, _ in xs) / 1e6:.2f}/"
                          f"{statistics.median(c for _, c in xs) / 1e6:.2f}" for p, xs in times[synced].items())
        print(f"rank {rank} {'synced ' if synced else 'no_sync'} (wall/CPU ms): {parts}", flush=True)
    dist.barrier()
    os._exit(0)  # torch 2.13's gloo can hang freeing its process group (tests/jobs/common.py)


if __name__ == "__main__":
    main()
