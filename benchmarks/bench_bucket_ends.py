"""How dagtop notes a gradient bucket's end on CPU ranks: what it costs the job and how close it is to the truth.

    torchrun --standalone --nproc-per-node 2 benchmarks/bench_bucket_ends.py               # 41 layers, a bucket each
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_bucket_ends.py --cap 25      # the same, 2 buckets

Two ways, on one 2-rank gloo job (benchmarks/advice_jobs.py's MLP; each rank's training thread pinned to a core):
``noticed``, dagtop as shipped (the training thread notices the end: instrument/polled.py), and ``callback``, the
end noted in a callback on the all-reduce's future, run on gloo's thread (dagtop before stop 38; what a GPU rank
still does). First the cost: plain DDP and both ways take turns every ``--block`` steps in the one job, and each
way's throughput against plain is paired per block (median and IQR over the blocks). Then the truth: with
``torch.profiler`` on, each bucket's end as dagtop noted it, against the end of the profiler's ``gloo:all_reduce``
for that all-reduce (the n-th of the trace for the n-th bucket; clocks aligned by a marker), for both ways. The
profiler notes that end itself in a callback on the future, after the threads waiting on it have woken: a noted
end a little before it is no error (``noticed`` waits on the future at the end of the backward).

Measured (stop 38, 2-core VM, load 1.4-1.5): 41 buckets, ``noticed`` ×0.817 of plain (IQR 0.763-1.013),
``callback`` ×0.568 (0.530-0.746); ends against the profiler's, median +82 µs (p10 +28, p90 +965) and -47 µs
(p10 -193, p90 -24). One bucket (``--cap 25``): ×0.915 (0.824-1.068) and ×0.875 (0.778-1.076); -2757 µs and
-426 µs, the profiler's end the later. Stop 49 (the buckets in flight after the backward stamped by their own
callbacks, load 0.8-1.0): 41 buckets ×0.802 (0.788-0.891) and ×0.754 (0.699-0.818), ends median -9 µs (p10 -85,
p90 +314) and -33 µs; one bucket ×0.888 (0.848-0.949) and ×0.877 (0.816-0.890), -1926 and -784 µs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
import advice_jobs


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def cost(plain: advice_jobs.Arm, timed: advice_jobs.Arm, tracer: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    """Per way, its throughput against plain in each block (each block's median step, plain's in the same round)."""
    polled = tracer._comm._polled
    medians: dict[str, list[float]] = {"plain": [], "noticed": [], "callback": []}
    for _ in range(args.blocks):
        for way, blocks in medians.items():
            tracer._comm._polled = None if way == "callback" else polled
            arm = plain if way == "plain" else timed
            steps = []
            last = time.perf_counter_ns()
            for s in range(args.block):
                arm.step()
                now = time.perf_counter_ns()
                if s:
                    steps.append(now - last)
                last = now
            blocks.append(statistics.median(steps) / 1e6)
    tracer._comm._polled = polled
    return medians


def lateness(timed: advice_jobs.Arm, tracer: Any, way: str, steps: int, rank: int) -> list[float] | None:
    """Rank 0: each bucket's end as dagtop noted it, less the profiler's end of its all-reduce, in µs."""
    polled = tracer._comm._polled
    tracer._comm._polled = None if way == "callback" else polled
    noted: list[tuple[Any, ...]] = []
    publisher = tracer._publisher
    publisher.put_iteration = lambda i, events, *rest: (noted.extend(events),
                                                        type(publisher).put_iteration(publisher, i, events, *rest))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        marks = []
        for _ in range(3):
            marks.append(time.perf_counter_ns())
            with record_function("bench:mark"):
                pass
        noted.clear()
        for _ in range(steps):
            timed.step()
    del publisher.put_iteration
    tracer._comm._polled = polled
    if rank != 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        trace = json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"]
    at = sorted(e["ts"] for e in trace if e.get("name") == "bench:mark")
    offset = statistics.median(m * 1000 - t for m, t in zip(at, marks))  # ns: the trace's clock less perf_counter_ns
    reduces = sorted((e for e in trace if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce"),
                     key=lambda e: e["ts"])
    buckets = sorted((e for e in noted if e[0] == "allreduce" and e[2].startswith("bucket")), key=lambda e: e[4])
    if len(reduces) != len(buckets):
        print(f"  {way}: {len(buckets)} buckets noted, {len(reduces)} all-reduces in the trace: not matched")
        return []
    return [(e[5] - ((r["ts"] + r["dur"]) * 1000 - offset)) / 1e3 for e, r in zip(buckets, reduces)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default=advice_jobs.SMALL_LAYERS)
    parser.add_argument("--cap", type=float, default=0.02, help="bucket_cap_mb")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--profiled-steps", type=int, default=20)
    args = parser.parse_args()
    job = argparse.Namespace(job="mlp", widths=args.widths, width=0, depth=0, batch=args.batch, io_ms=0.0, workers=0,
                             bucket_cap=args.cap, granularity="block", vocab=0, seq=0)
    os.environ.setdefault("DAGTOP_ENDPOINT", "tcp://127.0.0.1:1")  # nobody listens: every frame is still sent
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    plain, timed = advice_jobs.Arm("base", job, 2), advice_jobs.Arm("dagtop", job, 2)
    from instrument.tracer import open_tracer

    tracer = open_tracer()
    assert tracer is not None and tracer._comm is not None and tracer._comm._polled is not None, "not CPU ranks"
    for _ in range(3):
        plain.step()
        timed.step()
    medians = cost(plain, timed, tracer, args)
    late = {way: lateness(timed, tracer, way, args.profiled_steps, rank) for way in ("noticed", "callback")}
    if rank == 0:
        print(f"{len(timed.ddp.reducer._get_zeros_like_grad_buckets())} buckets, load {os.getloadavg()[0]:.1f}; "
              f"{args.blocks} blocks of {args.block} steps per arm")
        print(f"  plain      step {statistics.median(medians['plain']):7.2f} ms")
        for way in ("noticed", "callback"):
            q1, med, q3 = quartiles([p / w for p, w in zip(medians["plain"], medians[way])])
            print(f"  {way:9s}  step {statistics.median(medians[way]):7.2f} ms   throughput ×{med:.3f} of plain "
                  f"(IQR {q1:.3f}-{q3:.3f})")
        for way, values in late.items():
            if values:
                q = statistics.quantiles(values, n=10)
                print(f"  {way:9s}  end noted − profiler's end: median {statistics.median(values):+.0f} µs, "
                      f"p10 {q[0]:+.0f}, p90 {q[-1]:+.0f} ({len(values)} all-reduces)")
    tracer.close()
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # torch 2.13's gloo can hang freeing its process group (tests/jobs/common.py)


if __name__ == "__main__":
    main()
