"""What a byte of a gloo all-reduce costs by the bucket's size: the per-byte time an α-β fit on small buckets reads
against the one large buckets take.

    torchrun --standalone --nproc-per-node 2 benchmarks/allreduce_sizes.py [--repeat 40]

Two gloo ranks, each pinned to a core as benchmarks/advice_jobs.py's are, no dagtop: all-reduces of 16 KiB to 8 MiB,
each started after a barrier (so its time includes what is left of the barrier's skew: the latency reads high, the
per-byte slope does not), the sizes taking turns so the machine's load falls on all alike. Rank 0 prints each size's
median, the per-byte slope between neighbouring sizes, and an α-β fit below and above 1 MiB. What it is for: the bucket advice predicts a regrouping from
an α-β fit on the buckets it saw, and does not advise buckets over ``dagtop.model.buckets.REACH`` times the largest
(a cache's size changes what a byte costs).

Measured (2026-11-29, this 2-core VM, AMD EPYC, 1 MiB of L2 a core, 32 MiB of L3; two runs): the fit from 16 KiB to
1 MiB reads 0.331 and 0.357 ns a byte, the one from 1 to 8 MiB 0.567 and 0.547; 8 MiB took 4785 and 4612 µs, which
the first fit puts at 3097 and 3319 µs (35 and 28 % short).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

SIZES = tuple(n << 10 for n in (16, 64, 256, 512, 1024, 2048, 4096, 8192))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    buffers = {n: torch.ones(n // 4) for n in SIZES}
    took: dict[int, list[int]] = {n: [] for n in SIZES}
    for r in range(args.repeat + 2):
        for n in SIZES[r % len(SIZES):] + SIZES[:r % len(SIZES)]:
            dist.barrier()
            start = time.perf_counter_ns()
            dist.all_reduce(buffers[n])
            if r >= 2:  # the first rounds warm the connections and the allocator
                took[n].append(time.perf_counter_ns() - start)
    if rank == 0:
        median = {n: statistics.median(xs) for n, xs in took.items()}
        before = None
        for n in SIZES:
            slope = "" if before is None else f", {(median[n] - median[before]) / (n - before):.3f} ns a byte since"
            print(f"{n >> 10:5d} KiB {median[n] / 1e3:8.0f} µs{slope}", flush=True)
            before = n
        for lo, hi in ((SIZES[0], 1 << 20), (1 << 20, SIZES[-1])):
            xs = [n for n in SIZES if lo <= n <= hi]
            fit = statistics.linear_regression(xs, [median[n] for n in xs])
            print(f"α-β fit from {lo >> 10} to {hi >> 10} KiB: {fit.slope:.3f} ns a byte, {fit.intercept / 1e3:.0f} µs",
                  flush=True)
    dist.barrier()
    os._exit(0)  # torch 2.13's gloo can hang freeing its process group (tests/jobs/common.py)


if __name__ == "__main__":
    main()
