"""How much CPU gloo's threads take a step, with tiny buckets, DDP's default ones and no all-reduce at all.

    torchrun --standalone --nproc-per-node 2 benchmarks/gloo_cpu.py [--job mlp41] [--rounds 24]

One 2-rank gloo job, no dagtop (benchmarks/advice_jobs.py's MLPs, one model trained under three arms): the model
wrapped with the job's tiny buckets, the same weights wrapped with DDP's default buckets, and the tiny-bucket one
under ``no_sync``, taking turns every 8 steps (the first of each run not counted). Rank 0 prints, per arm, the median
step, the process's CPU time beside the training thread (``time.process_time_ns`` less ``time.thread_time_ns``: what
the shim sends as ``others_cpu_ns``), and the training thread's.

What it is for: the bucket advice weighs the all-reduce work a grouping runs beside the backward by that CPU time
over the α-β work of the buckets now (dagtop/model/buckets.py, ``steal_of``); what a regrouping changes it by is
the difference between the first two arms, and the third shows how much of it is gloo's.

Measured (2026-11-29, this 2-core VM, twice), step / CPU beside / training thread, ms: the 18-layer MLP (17
buckets) 29.17 / 9.19 / 14.38 and 31.77 / 9.13 / 14.15, DDP's default 24.63 / 5.98 / 13.18 and 23.27 / 5.92 /
12.79, ``no_sync`` 7.92 / 0.02 / 7.90 and 7.67 / 0.02 / 7.64; the 41-layer MLP (41 buckets) 32.78 / 11.77 / 15.58
and 28.22 / 9.86 / 14.23, DDP's default 24.37 / 5.16 / 14.06 and 21.67 / 4.58 / 12.40, ``no_sync`` 8.77 / 0.02 /
8.72 and 7.87 / 0.02 / 7.83. Against the α-β work the recordings' fits put between the two groupings (6.83 and
8.35 ms), the CPU moved 0.47 and 0.47 ms per ms on the first MLP, 0.79 and 0.63 on the second, where the
recordings' whole CPU time over their work read 0.68 and 0.85 (run 11 of benchmarks/validate_advice.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import advice_jobs

JOBS = {  # benchmarks/validate_advice.py's jobs of tiny buckets: widths, bucket_cap_mb
    "mlp18": ("256,768,128,512,384,640,256,896,192,512,320,768,256,448,128,640,384,256", 0.05),
    "mlp41": (advice_jobs.SMALL_LAYERS, 0.02),
}
ARMS = ("tiny buckets", "DDP's default", "no_sync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="mlp18")
    parser.add_argument("--rounds", type=int, default=24)
    extra = parser.parse_args()
    widths, cap = JOBS[extra.job]
    args = argparse.Namespace(job="mlp", width=1024, depth=8, widths=widths, batch=32, seq=64, vocab=4096, io_ms=1.0,
                              workers=0, bucket_cap=None, granularity="block")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = advice_jobs.model_of(args)
    tiny = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    default = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    wrapped = {"tiny buckets": tiny, "DDP's default": default, "no_sync": tiny}
    optimizers = {id(m): torch.optim.SGD(m.parameters(), lr=1e-4) for m in (tiny, default)}
    batches = advice_jobs.forever(advice_jobs.loader_of(args, 0))
    rows: dict[str, list[tuple[int, int, int]]] = {arm: [] for arm in ARMS}

    def step(arm: str, keep: bool) -> None:
        ddp = wrapped[arm]
        wall, process, thread = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
        x, y = next(batches)
        with ddp.no_sync() if arm == "no_sync" else contextlib.nullcontext():
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizers[id(ddp)].step()
        optimizers[id(ddp)].zero_grad(set_to_none=True)
        spent = time.thread_time_ns() - thread
        if keep:
            rows[arm].append((time.perf_counter_ns() - wall, time.process_time_ns() - process - spent, spent))

    for arm in ARMS * 2:  # warm-up: DDP rebuilds its buckets after the first step
        step(arm, False)
    for r in range(extra.rounds):
        for arm in ARMS[r % 3:] + ARMS[:r % 3]:
            for s in range(8):
                step(arm, s > 0)
    if dist.get_rank() == 0:
        for arm, xs in rows.items():
            step_ms, beside, training = (statistics.median(x[i] for x in xs) / 1e6 for i in range(3))
            print(f"{extra.job} {arm:14} step {step_ms:6.2f} ms, CPU beside the training thread {beside:6.2f} ms, "
                  f"the training thread's {training:6.2f} ms", flush=True)
    dist.barrier()
    os._exit(0)  # torch 2.13's gloo can hang freeing its process group (tests/jobs/common.py)


if __name__ == "__main__":
    main()
