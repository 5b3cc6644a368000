"""Where gradient accumulation's gain comes from, part by part, on one job: what the advice's replay keeps and drops.

    DAGTOP_ENDPOINT=tcp://127.0.0.1:PORT torchrun --standalone --nproc-per-node 2 benchmarks/accumulation_parts.py
    ... benchmarks/accumulation_parts.py --cap 0.02          # a bucket per layer

One 2-rank gloo job (benchmarks/advice_jobs.py's MLP of 41 small layers, each rank pinned to a core); its ways of
stepping take turns every ``--block`` steps, the order rotated every round, so the machine's load falls on all alike:

* ``base``: every step synced; ``accumulate 4``: ``no_sync`` over 3 micro-batches of 4, one update;
* ``no_sync``: every step under ``no_sync`` (no all-reduce, and no gradient copied into DDP's buckets);
* ``no-op hook``: a comm hook that communicates nothing (DDP's bucket copies, no all-reduce);
* the same job with dagtop attached (``dagtop``), stepping synced, accumulating 4, and under ``no_sync``: one tracer
  a process, so one model toggled between the three.

Prints each way's time per micro-batch (median and IQR) and the training thread's CPU time in it
(``time.thread_time_ns``), accumulation's throughput gain without and with dagtop, and
the parts: dagtop's own cost per micro-batch, DDP's copies of the gradients into its buckets (``no-op hook`` less
``no_sync``; ``no_sync`` skips them) and the all-reduces (``base`` less ``no-op hook``).

Measured (stop 40, 2-core VM, load 1.2-1.5): default buckets, base 18.65 ms a micro-batch, accumulating 10.21:
×1.826 plain, ×1.709 with dagtop attached (21.11 against 12.35 ms); dagtop's own cost 1.84-2.46 ms, the bucket copies
2.34 ms, the all-reduces 8.81 ms. A bucket per layer (``--cap 0.02``): ×2.007 plain, ×1.934 with dagtop; dagtop
1.62-4.12 ms, the copies 2.60 ms. The advice had predicted ×1.39 and ×1.64 for these two jobs (stop 38): its replay
of a ``no_sync`` micro-batch kept the bucket copies, which dagtop did not time, far more than its own cost. The shim
now times them (the ``buckets`` frame's ``copy_ns``: 2.07 and 2.12 ms on the two ranks of a run that measured 2.25
here), with autograd's adds of each micro-batch's gradients (``add_ns``), and the replay prices both.

The training thread's CPU time (stop 42, load 0.9, 14 rounds): synced 11.79 ms of a 19.37-ms micro-batch, with a
no-op hook 10.04 of 10.07, under ``no_sync`` 7.62 of 7.66. A step without communication is the thread's own work
alone; a synced step's thread works 2.4 ms more on the copies and 1.75 ms more beside gloo, and is off the core or
waiting 7.6 ms. What the advice's replay of a micro-batch under ``no_sync`` has to find is the 7.62: measured so on
the training thread it would need no fit of compute's slow-down under collectives, which a job whose every step
communicates cannot show (dagtop/model/interference.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import advice_jobs

WAYS = (  # name, arm, micro-batches per update, every step under no_sync
    ("base", "base", 1, False), ("accumulate 4", "accumulate=4", 4, False), ("no_sync", "nosync", 1, True),
    ("no-op hook", "hook=noop", 1, False), ("dagtop", "dagtop", 1, False), ("dagtop, accumulate 4", "dagtop", 4, False),
    ("dagtop, no_sync", "dagtop", 1, True),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=28)
    parser.add_argument("--block", type=int, default=5, help="steps of a way in a row (the first is not counted)")
    parser.add_argument("--cap", type=float, default=None, help="bucket_cap_mb (default: DDP's)")
    parser.add_argument("--out", default="", help="rank 0 also writes the step times here (JSON)")
    extra = parser.parse_args()
    args = argparse.Namespace(job="mlp", width=1024, depth=8, widths=advice_jobs.SMALL_LAYERS, batch=32, seq=64,
                              vocab=4096, io_ms=1.0, workers=0, bucket_cap=extra.cap, granularity="block")
    advice_jobs.shield()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    arms = {arm: advice_jobs.Arm(arm, args, world) for arm in dict.fromkeys(a for _, a, _, _ in WAYS)}

    def step_as(way: tuple[str, str, int, bool]) -> None:
        _, arm, micro, nosync = way
        a = arms[arm]
        a.accumulate, a.nosync = micro, nosync
        a.step()

    for way in WAYS:  # warm-up: DDP rebuilds its buckets after the first step
        for _ in range(3):
            step_as(way)
    per_micro: dict[str, list[float]] = {name: [] for name, *_ in WAYS}
    cpu_micro: dict[str, list[float]] = {name: [] for name, *_ in WAYS}
    for r in range(extra.rounds):
        for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
            last, last_cpu = time.perf_counter_ns(), time.thread_time_ns()
            for s in range(extra.block):
                step_as(way)
                now, now_cpu = time.perf_counter_ns(), time.thread_time_ns()
                if s:
                    per_micro[way[0]].append((now - last) / 1e6 / way[2])
                    cpu_micro[way[0]].append((now_cpu - last_cpu) / 1e6 / way[2])
                last, last_cpu = now, now_cpu
    if rank == 0:
        report(per_micro, cpu_micro)
        if extra.out:
            Path(extra.out).write_text(json.dumps({"ms_per_micro_batch": per_micro, "cpu_ms_per_micro_batch": cpu_micro,
                                                   "load": os.getloadavg()}))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # torch 2.13's gloo can hang freeing its process group (tests/jobs/common.py)


def report(per_micro: dict[str, list[float]], cpu_micro: dict[str, list[float]]) -> None:
    m = {name: statistics.median(xs) for name, xs in per_micro.items()}
    for name, xs in per_micro.items():
        q = statistics.quantiles(xs, n=4)
        cpu = statistics.median(cpu_micro[name])
        print(f"{name:<22} {m[name]:7.2f} ms a micro-batch (IQR {q[0]:.2f}-{q[2]:.2f}, {len(xs)} steps); the "
              f"training thread ran {cpu:.2f} ms of it")
    print(f"accumulating 4: ×{m['base'] / m['accumulate 4']:.3f} plain, "
          f"×{m['dagtop'] / m['dagtop, accumulate 4']:.3f} with dagtop attached")
    print(f"dagtop's own cost {m['dagtop'] - m['base']:.2f} ms synced, {m['dagtop, no_sync'] - m['no_sync']:.2f} ms "
          f"under no_sync; DDP's bucket copies {m['no-op hook'] - m['no_sync']:.2f} ms; "
          f"the all-reduces {m['base'] - m['no-op hook']:.2f} ms (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
