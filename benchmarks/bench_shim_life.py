"""The shim's cost at the two ends of a run: its start-up, and whether its CPU per step stays flat over a long run.

    python benchmarks/bench_shim_life.py --startup          # attach + hello + first frames, 7 fresh processes
    python benchmarks/bench_shim_life.py --long 600         # a 10-minute run: CPU per step, minute by minute
    python benchmarks/bench_shim_life.py --startup --long 120

Start-up: a fresh process per repeat (nothing imported before it but torch and the job), the communication-heavy
MLP of benchmarks/job_kinds.py in DDP at world size 1 (gloo, so the bucket tap is installed too), a monitor
listening (a SUB socket in this process). Measured: the process's CPU from ``import instrument`` through
``attach()``, three training steps and until the monitor has read the rank's hello and those three iterations (the
process waits, keeping its socket, on a blocking read until this side says so), minus the CPU of three plain steps
of the same model just before; and each thread's part of it. The shim's bytecode is compiled once, by a first
process reported apart, and read by the others, as it is for an installed package.

Long run: the communication-heavy job (or another kind: ``--kind``) on two ranks (gloo, a core each), dagtop
attached once for the whole run, its timing switched off and on every 20 steps (``Tracer._on``, the switch every
hook reads), so each minute has its own paired measure of what the shim adds; everything the shim keeps across
iterations keeps growing or not regardless. Per minute: the ranks' CPU per step with the shim on and off (all
threads, medians of the blocks), their difference, and each rank's resident memory; over the whole run, CPU per
step and step time, on − off. "Off" still runs what the switch does not stop: the forward hooks' calls (returning at
once), the tap's call per bucket, the publisher's and telemetry's threads (heartbeat, telemetry); so on − off is
what the shim's timing and hand-over cost, below its whole cost (benchmarks/bench_overhead.py measures that against
plain DDP, across runs).
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
print("stepped", flush=True)
sys.stdin.readline()  # until the monitor has read the hello and the three iterations (a blocking read: no CPU)
total, after = time.process_time() - cpu, thread_cpu()
tracer.close()
print(json.dumps({{"attach": attach_cpu, "startup": total - plain_cpu,
                  "threads": {{k: (after[k] - threads[k] - plain_threads[k]) / 1e9 for k in threads}}}}))
"""


def _delivered(monitor: Any, pid: int, deadline_s: float = 60.0) -> bool:
    """Read the monitor's socket until the process ``pid`` has delivered its hello and three iterations."""
    from instrument import wire

    senders: dict[int, int] = {}
    iterations: dict[int, int] = {}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not monitor.poll(100):
            continue
        frame = wire.decode(monitor.recv())
        if isinstance(frame, wire.Hello):
            senders[frame.pid] = frame.sender
        elif isinstance(frame, wire.IterationBatch):
            iterations[frame.sender] = iterations.get(frame.sender, 0) + 1
        if pid in senders and iterations.get(senders[pid], 0) >= 3:
            return True
    return False


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
    cache = tempfile.TemporaryDirectory()
    try:
        for _ in range(repeats + 1):
            code = _STARTUP_CHILD.format(benchmarks=str(Path(__file__).resolve().parent), port=str(free_port()),
                                         endpoint=endpoint)
            # The shim's bytecode written once and read after, as an installed package has it (pip compiles it at
            # install); the first child, which compiles it, is reported apart.
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPYCACHEPREFIX": cache.name}
            for name in ("DAGTOP_DISABLE", "PYTHONDONTWRITEBYTECODE"):
                env.pop(name, None)
            child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
            try:
                assert child.stdout is not None and child.stdin is not None
                while child.stdout.readline().strip() not in ("stepped", ""):
                    pass
                delivered = _delivered(monitor, child.pid)
                child.stdin.write("\n")
                child.stdin.flush()
                out, err = child.communicate(timeout=300)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if child.returncode or not lines or not delivered:
                raise RuntimeError(f"start-up child failed (delivered: {delivered}):\n{out}\n{err}")
            rows.append(json.loads(lines[-1]))
    finally:
        monitor.close()
        context.term()
        cache.cleanup()
    cold, rows = rows[0], rows[1:]

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.1f} ms ({min(values) * 1e3:.1f}..{max(values) * 1e3:.1f})"

    print(f"start-up, {repeats} fresh processes (MLP in DDP at world size 1, a monitor listening; "
          f"load average {os.getloadavg()[0]:.2f}); median (min..max) of CPU:")
    print(f"  import instrument + attach(), on the calling thread: {spread([r['attach'] for r in rows])}")
    print(f"  through the hello and the first 3 iterations read by the monitor, all threads, over three plain steps: "
          f"{spread([r['startup'] for r in rows])}")
    parts = [f"{k} {statistics.median(r['threads'][k] for r in rows) * 1e3:+.1f}" for k in rows[0]["threads"]]
    print(f"  by thread, ms: {', '.join(parts)}")
    print(f"  the first process, compiling the shim's bytecode: attach {cold['attach'] * 1e3:.1f} ms, through delivery "
          f"{cold['startup'] * 1e3:.1f} ms")


def _long_rank(rank: int, port: int, seconds: float, out: str, kind: str = "mlp") -> None:
    import job_kinds
    import torch
    import torch.distributed as dist
    from bench_overhead import thread_cpu
    from torch import nn

    import instrument
    from dagtop.demo.launch import free_endpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.multiprocessing.set_start_method("fork", force=True)  # the loader job's workers, as torchrun's ranks do
    torch.set_num_threads(1)
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    job = job_kinds.make(kind, rank)
    ddp = nn.parallel.DistributedDataParallel(job.model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    tracer: Any = instrument.attach(ddp, optimizer, endpoint=free_endpoint())
    # The loader job's batches keep coming from its workers (timed, as the other kinds' are not: the wait is its
    # step); the others' are made once and gone through again.
    batches = iter(tracer.loader(job.batches(1_000_000))) if kind == "loader" else itertools.cycle(job.batches(64))
    rows = []
    started = time.monotonic()
    block = 0
    stop = torch.zeros(1)
    while True:
        on = block % 2 == 0
        tracer._on = on
        for i in range(BLOCK):
            if i == 1:
                cpu, threads, wall = time.process_time(), thread_cpu(), time.perf_counter()
            x, y = next(batches)
            loss = job.loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = thread_cpu()
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        rows.append({"t": time.monotonic() - started, "on": on, "cpu": (time.process_time() - cpu) / (BLOCK - 1),
                     "step": (time.perf_counter() - wall) / (BLOCK - 1),
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


def long_run(seconds: float, kind: str = "mlp") -> None:
    import torch.multiprocessing as mp

    from dagtop.demo.launch import free_port

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_long_rank, args=(free_port(), seconds, tmp, kind), nprocs=2, start_method="spawn")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    minutes = max(1, round(seconds / 60))
    span = seconds / minutes
    print(f"long run, {seconds:.0f} s, the {kind} job on 2 ranks, the shim switched on and off every "
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
    _whole_run(ranks)


def _whole_run(ranks: list[list[dict[str, Any]]]) -> None:
    """Over the whole run: on − off of each (on block, next off block) pair of each rank, in ms and in % of off, for
    CPU per step and for step time (each rank's mean step over the block)."""
    pairs = [(a, b) for rows in ranks for a, b in itertools.pairwise(rows) if a["on"] and not b["on"]]
    if len(pairs) < 2:
        return

    def spread(values: list[float], fmt: str) -> str:
        q = statistics.quantiles(values, n=4)
        return f"{q[1]:{fmt}} ({q[0]:{fmt}}..{q[2]:{fmt}})"

    cpu = [(a["cpu"] - b["cpu"]) * 1e3 for a, b in pairs]
    cpu_pct = [(a["cpu"] / b["cpu"] - 1) * 100 for a, b in pairs]
    step_pct = [(a["step"] / b["step"] - 1) * 100 for a, b in pairs]
    off_cpu = statistics.median(b["cpu"] for _, b in pairs) * 1e3
    off_step = statistics.median(b["step"] for _, b in pairs) * 1e3
    print(f"  whole run, {len(pairs)} pairs of blocks (both ranks), median (IQR): off {off_cpu:.2f} ms CPU per rank per "
          f"step, {off_step:.1f} ms per step; on − off CPU {spread(cpu, '+.3f')} ms, {spread(cpu_pct, '+.2f')} %; "
          f"step time {spread(step_pct, '+.2f')} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--long", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--kind", default="mlp", choices=("cnn", "mlp", "loader", "transformer"),
                        help="the long run's job (benchmarks/job_kinds.py; default: the communication-heavy MLP)")
    args = parser.parse_args(argv)
    if not args.startup and not args.long:
        parser.error("say --startup, --long SECONDS, or both")
    if args.startup:
        startup(args.repeats)
    if args.long:
        long_run(args.long, args.kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
