"""The shim's cost at the two ends of a run: its start-up, and whether its CPU per step stays flat over a long run.

    python benchmarks/bench_shim_life.py --startup          # attach + hello + first frames, 7 fresh processes
    python benchmarks/bench_shim_life.py --long 600         # a 10-minute run: CPU per step, minute by minute
    python benchmarks/bench_shim_life.py --startup --long 120

Start-up: a fresh process per repeat (nothing imported before it but torch and the job), the communication-heavy
MLP of benchmarks/job_kinds.py in DDP at world size 1 (gloo, so the bucket tap is installed too), a monitor
listening (a SUB socket in this process). Measured: the process's CPU from ``import instrument`` through
``attach()``, three training steps and until the publisher has sent its hello and those three iterations, minus
the CPU of three plain steps of the same model just before; and each thread's part of it.

Long run: the communication-heavy job on two ranks (gloo, a core each), dagtop attached once for the whole run,
its timing switched off and on every 20 steps (``Tracer._on``, the switch every hook reads), so each minute has
its own paired measure of what the shim adds; everything the shim keeps across iterations keeps growing or not
regardless. Per minute: the ranks' CPU per step with the shim on and off (all threads, medians of the blocks),
their difference, and each rank's resident memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

BLOCK = 20
"""Steps between two flips of the switch in the long run; the first step after each flip is not counted."""

_STARTUP_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {benchmarks!r})
import torch, torch.distributed as dist
from torch import nn
torch.set_num_threads(1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT={port!r})
dist.init_process_group("gloo", rank=0, world_size=1)
import job_kinds
from bench_overhead import thread_cpu
job = job_kinds.make("mlp", 0)
ddp = nn.parallel.DistributedDataParallel(job.model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
batches = job.batches(9)

def step(x, y):
    loss = job.loss(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

for x, y in batches[:3]:
    step(x, y)
cpu, threads = time.process_time(), thread_cpu()
for x, y in batches[3:6]:
    step(x, y)
plain_cpu, plain_threads = time.process_time() - cpu, thread_cpu()
plain_threads = {{k: plain_threads[k] - threads[k] for k in threads}}
cpu, threads = time.process_time(), thread_cpu()
import instrument
tracer = instrument.attach(ddp, optimizer, endpoint={endpoint!r})
attach_cpu = time.process_time() - cpu
for x, y in batches[6:]:
    step(x, y)
deadline = time.monotonic() + 10
while tracer._publisher.iterations < 3 and time.monotonic() < deadline:
    time.sleep(0.002)
total, after = time.process_time() - cpu, thread_cpu()
sent = tracer._publisher.iterations
tracer.close()
print(json.dumps({{"attach": attach_cpu, "startup": total - plain_cpu, "sent": sent,
                  "threads": {{k: (after[k] - threads[k] - plain_threads[k]) / 1e9 for k in threads}}}}))
"""


def startup(repeats: int = 7) -> None:
    import zmq

    from dagtop.demo.launch import free_endpoint, free_port

    endpoint = free_endpoint()
    context = zmq.Context()
    monitor = context.socket(zmq.SUB)
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.bind(endpoint)
    monitor.setsockopt(zmq.SUBSCRIBE, b"")
    rows = []
    try:
        for _ in range(repeats):
            code = _STARTUP_CHILD.format(benchmarks=str(Path(__file__).resolve().parent), port=str(free_port()),
                                         endpoint=endpoint)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            env.pop("DAGTOP_DISABLE", None)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                                  check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                raise RuntimeError(f"start-up child failed:\n{done.stdout}\n{done.stderr}")
            rows.append(json.loads(lines[-1]))
        frames = 0
        while monitor.poll(0):
            monitor.recv()
            frames += 1
    finally:
        monitor.close()
        context.term()

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.1f} ms ({min(values) * 1e3:.1f}..{max(values) * 1e3:.1f})"

    print(f"start-up, {repeats} fresh processes (MLP in DDP at world size 1, a monitor listening; "
          f"load average {os.getloadavg()[0]:.2f}); median (min..max) of CPU:")
    print(f"  import instrument + attach(), on the calling thread: {spread([r['attach'] for r in rows])}")
    print(f"  through hello and the first {min(r['sent'] for r in rows)} iterations sent, all threads, over three "
          f"plain steps: {spread([r['startup'] for r in rows])}")
    parts = [f"{k} {statistics.median(r['threads'][k] for r in rows) * 1e3:+.1f}" for k in rows[0]["threads"]]
    print(f"  by thread, ms: {', '.join(parts)}; {frames} frames reached the monitor")


def _long_rank(rank: int, port: int, seconds: float, out: str) -> None:
    import job_kinds
    import torch
    import torch.distributed as dist
    from bench_overhead import thread_cpu
    from torch import nn

    import instrument
    from dagtop.demo.launch import free_endpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    job = job_kinds.make("mlp", rank)
    ddp = nn.parallel.DistributedDataParallel(job.model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    tracer: Any = instrument.attach(ddp, optimizer, endpoint=free_endpoint())
    batches = job.batches(64)
    rows = []
    started = time.monotonic()
    block = 0
    stop = torch.zeros(1)
    while True:
        on = block % 2 == 0
        tracer._on = on
        for i in range(BLOCK):
            if i == 1:
                cpu, threads = time.process_time(), thread_cpu()
            x, y = batches[(block * BLOCK + i) % len(batches)]
            loss = job.loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = thread_cpu()
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        rows.append({"t": time.monotonic() - started, "on": on, "cpu": (time.process_time() - cpu) / (BLOCK - 1),
                     "threads": {k: (after[k] - threads[k]) / 1e9 / (BLOCK - 1) for k in after}, "rss": rss})
        block += 1
        stop[0] = float(rank == 0 and time.monotonic() - started >= seconds and not on)
        dist.all_reduce(stop)  # both ranks stop after the same block, an "off" one
        if stop[0]:
            break
    tracer._on = True
    tracer.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def long_run(seconds: float) -> None:
    import torch.multiprocessing as mp

    from dagtop.demo.launch import free_port

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_long_rank, args=(free_port(), seconds, tmp), nprocs=2, start_method="spawn")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    minutes = max(1, round(seconds / 60))
    span = seconds / minutes
    print(f"long run, {seconds:.0f} s, communication-heavy MLP on 2 ranks, the shim switched on and off every "
          f"{BLOCK} steps; load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(f"  {'minute':>6} {'CPU/rank/step on, ms':>21} {'off, ms':>9} {'on − off, ms (IQR of pairs)':>29}"
          f" {'shim threads, µs':>17} {'RSS, MB':>13}")
    firsts: list[float] = []
    for m in range(minutes):
        pairs, on_cpu, off_cpu, shim, rss = [], [], [], [], []
        for rows in ranks:
            inside = [r for r in rows if m * span <= r["t"] < (m + 1) * span or (m == minutes - 1 and r["t"] >= m * span)]
            for a, b in itertools.pairwise(inside):
                if a["on"] and not b["on"]:
                    pairs.append(a["cpu"] - b["cpu"])
            on_cpu += [r["cpu"] for r in inside if r["on"]]
            off_cpu += [r["cpu"] for r in inside if not r["on"]]
            shim += [r["threads"]["dagtop-publisher"] + r["threads"]["dagtop-telemetry"] + r["threads"]["zmq"]
                     for r in inside if r["on"]]
            rss += [r["rss"] for r in inside]
        if not pairs:
            continue
        q = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
        firsts.append(statistics.median(pairs))
        print(f"  {m + 1:>6} {statistics.median(on_cpu) * 1e3:>21.2f} {statistics.median(off_cpu) * 1e3:>9.2f}"
              f" {statistics.median(pairs) * 1e3:>+13.3f} ({q[0] * 1e3:+.3f}..{q[2] * 1e3:+.3f})"
              f" {statistics.median(shim) * 1e6:>17.0f} {max(rss) / 2**20:>13.0f}")
    if len(firsts) > 1:
        print(f"  on − off, last minute minus first: {(firsts[-1] - firsts[0]) * 1e3:+.3f} ms per rank per step")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--long", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    if not args.startup and not args.long:
        parser.error("say --startup, --long SECONDS, or both")
    if args.startup:
        startup(args.repeats)
    if args.long:
        long_run(args.long)
    return 0


if __name__ == "__main__":
    sys.exit(main())
