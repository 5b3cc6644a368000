"""What the shim costs a training job: each rank's CPU per step beside step time, on five kinds of job.

    python benchmarks/bench_overhead.py                        # 12 rounds of each kind, ~12 minutes on 2 cores
    python benchmarks/bench_overhead.py --rounds 3 --steps 10  # a quick look
    python benchmarks/bench_overhead.py --jobs mlp --modes plain block allreduce_hook layer

Each kind (benchmarks/job_kinds.py: compute-heavy CNN, communication-heavy MLP, loader-bound job with DataLoader
workers, small transformer, many small layers with a bucket each) runs on two ranks of this machine (gloo, one torch thread per rank, each rank pinned to
a core), each rank one process that runs every mode in turn on the same model: a fresh ``DistributedDataParallel``
per run, modes rotated every round so no mode always runs first. ``plain`` is DDP with its built-in C++
all-reduce, the baseline; ``plain again``, the same once more: what the paired measure says of no change at all
(its noise on this machine at this load); ``block`` is dagtop as shipped (default granularity, telemetry and
heartbeats on);
``allreduce_hook`` (PyTorch's Python comm hook, for reference), ``layer`` and ``layer 1 in 10`` on request, and
``block, bucket callbacks``: dagtop with each bucket's end noted as it was before (a callback on the all-reduce's
future, which runs on gloo's thread and waits there for the GIL; instrument/polled.py).
Nothing listens on the endpoint: the publisher still encodes and sends every frame.

Per round and mode: the slower rank's median step, and each rank's CPU per step — ``time.process_time()`` of
the rank (every thread: training, gloo's, the shim's) plus, for the loader job, its DataLoader workers' CPU
(``RUSAGE_CHILDREN`` once the workers have exited, spread over the batches they made). "paired" is the median
over rounds of each round's mode − plain (seconds apart, so drift cancels), with its interquartile range.
Per thread (``/proc/self/task/*/schedstat``): where the difference goes.

Per event: a chain of 100 tiny layers where hooks are nearly all the work, no hooks, torch's bare hooks and dagtop's
per-layer timing in blocks of 20 steps in turn, paired per round: torch's bare hook dispatch next to dagtop's
per-layer timing, as training-thread µs per event; and the
publisher thread's µs to fill the spans and encode one such iteration. Start-up and a long run's flatness:
benchmarks/bench_shim_life.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job_kinds

import instrument
from dagtop.demo.launch import free_endpoint, free_port

MODES: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "plain again": None,
    "block": {"granularity": "block"},
    "block, bucket callbacks": {"granularity": "block"},
    "allreduce_hook": None,
    "layer 1 in 10": {"granularity": "block", "sample_every": 10},
    "layer": {"granularity": "layer"},
}
WARMUP = 3
THREADS = ("main", "gloo", "dagtop-publisher", "dagtop-telemetry", "zmq", "other")
"""The rank's threads, grouped: the training thread, gloo's (run loops and TCP loop), the shim's, ZeroMQ's."""
STEPS = {"cnn": 25, "mlp": 40, "loader": 25, "transformer": 30, "layers": 40}
"""Steps per run (after the warm-up), about a second of each kind on two ranks of this machine."""


def thread_cpu() -> dict[str, int]:
    """CPU nanoseconds of each of this process's threads so far, grouped as :data:`THREADS`."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out = dict.fromkeys(THREADS, 0)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread has just ended
            continue
        name = "main" if int(tid) == main else names.get(int(tid), comm)
        group = "gloo" if "gloo" in name else "zmq" if name.startswith("ZMQ") else name
        out[group if group in out else "other"] += ns
    return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(job: job_kinds.Job, mode: str, steps: int) -> dict[str, Any]:
    """One run of ``mode``: this rank's median step, CPU per step (own and its workers'), CPU per step by thread."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp = nn.parallel.DistributedDataParallel(job.model, **job.ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    if mode == "allreduce_hook":
        ddp.register_comm_hook(dist.group.WORLD, allreduce_hook)
    options = MODES[mode]
    tracer: Any = instrument.NullTracer() if options is None else instrument.attach(
        ddp, optimizer, endpoint=free_endpoint(), **options)
    if mode == "block, bucket callbacks" and tracer._comm is not None:
        tracer._comm._polled = None  # each bucket's end noted in a callback on gloo's thread, as before stop 38
    batches = job.batches(WARMUP + steps)
    children = _children_cpu()
    stamps: list[float] = []
    cpu, threads = 0.0, thread_cpu()
    for i, (x, y) in enumerate(tracer.loader(batches)):
        stamps.append(time.perf_counter())
        if i == WARMUP:
            cpu, threads = time.process_time(), thread_cpu()
        loss = job.loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    stamps.append(time.perf_counter())
    cpu = (time.process_time() - cpu) / steps
    after = thread_cpu()
    tracer.close()
    del batches  # a DataLoader's workers have exited with its last batch: their CPU is counted now
    workers = (_children_cpu() - children) / (WARMUP + steps)
    # The median step, not the mean: a step the VM's scheduler stalled says nothing about the mode.
    step = statistics.median(b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1:]))
    return {"mode": mode, "step": step, "cpu": cpu, "workers": workers,
            "threads": {k: (after[k] - threads[k]) / 1e9 / steps for k in THREADS}}


def _rank(rank: int, port: int, kind: str, rounds: int, steps: int, modes: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Spawned, this rank would spawn its DataLoader workers too (a second of imports each); torchrun's ranks fork.
    mp.set_start_method("fork", force=True)
    torch.set_num_threads(1)
    if len(os.sched_getaffinity(0)) >= 2:  # a core each: the shim's threads compete with their own rank only
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    job = job_kinds.make(kind, rank)
    with open(Path(out) / f"rank{rank}.jsonl", "w") as sink:
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[: r % len(modes)]:
                dist.barrier()
                sink.write(json.dumps({"round": r, **_run(job, mode, steps)}) + "\n")
            if rank == 0:
                print(f"  {kind}: round {r + 1}/{rounds}", file=sys.stderr, end="\r")
    dist.destroy_process_group()


def interleaved(kind: str, rounds: int, steps: int, modes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Per mode, per round: the slower rank's median step, the ranks' mean CPU per step (own + workers'), and
    the ranks' mean CPU per step of each thread group; in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(free_port(), kind, rounds, steps, modes, tmp), nprocs=2,
                           start_method="spawn")
        rows = [[json.loads(line) for line in (Path(tmp) / f"rank{r}.jsonl").read_text().splitlines()]
                for r in range(2)]
    out: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for a, b in zip(*rows):
        out[a["mode"]].append({
            "step": max(a["step"], b["step"]),
            "cpu": (a["cpu"] + a["workers"] + b["cpu"] + b["workers"]) / 2,
            "workers": (a["workers"] + b["workers"]) / 2,
            "threads": {k: (a["threads"][k] + b["threads"][k]) / 2 for k in THREADS},
        })
    return out


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, statistics.median(values), q3


def _spread(values: list[float], scale: float, fmt: str) -> str:
    q1, q2, q3 = _quartiles([v * scale for v in values])
    return f"{q2:{fmt}} ({q1:{fmt}}..{q3:{fmt}})"


def table(kind: str, times: dict[str, list[dict[str, Any]]], steps: int, load: tuple[float, float]) -> None:
    plain = times["plain"]
    print(f"{kind}: {len(plain)} interleaved rounds of {steps} steps, 2 ranks (gloo, 1 thread each, a core each); "
          f"load average {load[0]:.2f} before, {load[1]:.2f} after")
    print(f"  {'mode':<14} {'step ms (IQR)':>22} {'step vs plain (IQR)':>24} {'CPU/rank/step ms (IQR)':>24}"
          f" {'CPU vs plain, ms (IQR)':>26} {'CPU vs plain, % (IQR)':>25}")
    for mode, rows in times.items():
        step = [r["step"] for r in rows]
        cpu = [r["cpu"] for r in rows]
        line = f"  {mode:<14} {_spread(step, 1e3, '.2f'):>22}"
        if mode == "plain":
            print(f"{line} {'':>24} {_spread(cpu, 1e3, '.2f'):>24}")
            continue
        step_pct = [(s / p["step"] - 1) for s, p in zip(step, plain)]
        cpu_ms = [(c - p["cpu"]) for c, p in zip(cpu, plain)]
        cpu_pct = [(c / p["cpu"] - 1) for c, p in zip(cpu, plain)]
        print(f"{line} {_spread(step_pct, 100, '+.2f') + ' %':>24} {_spread(cpu, 1e3, '.2f'):>24}"
              f" {_spread(cpu_ms, 1e3, '+.3f'):>26} {_spread(cpu_pct, 100, '+.2f') + ' %':>25}")
        parts = []
        for group in THREADS:
            diffs = [r["threads"][group] - p["threads"][group] for r, p in zip(rows, plain)]
            parts.append(f"{group} {statistics.median(diffs) * 1e6:+.0f}")
        if any(r["workers"] for r in rows):
            diffs = [r["workers"] - p["workers"] for r, p in zip(rows, plain)]
            parts.append(f"DataLoader workers {statistics.median(diffs) * 1e6:+.0f}")
        print(f"  {'':<14} by thread, µs per rank per step vs plain (median of paired rounds): {', '.join(parts)}")
    if any(r["workers"] for r in plain):
        print(f"  (CPU includes the {job_kinds.LOADER_WORKERS} DataLoader workers of each rank: "
              f"{_spread([r['workers'] for r in plain], 1e3, '.2f')} ms per step in plain)")


def per_event_cost(layers: int = 100, blocks: int = 30, steps: int = 20,
                   warmup: int = 3) -> tuple[tuple[float, float, float], tuple[float, float, float], int, float]:
    """Training-thread µs per event: torch's bare hook dispatch, and dagtop's per-layer timing, both against no hooks;
    the events per step; the publisher thread's µs to encode one such step.

    The three modes run in turn in one process, a block of ``steps`` each (hooks put on before the block, taken off
    after it, ``warmup`` steps untimed), their order rotated every round; a block's figure is its median step, and
    each round's bare and dagtop blocks are paired with its plain one (seconds apart, so the machine's drift
    cancels). Median over rounds and interquartile range, per event. (Runs of their own, minimum of repeats, as this
    was measured before, put 25-30 µs on dagtop: on a shared VM a run's quarter-second windows vary up to 2×.)"""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    a, b = torch.randn(2, 4), torch.randn(2, 4)

    def noop_node(*_: Any) -> None:
        return None

    def noop_pre(module: nn.Module, args: Any) -> None:
        return None

    def noop_post(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        output.grad_fn.register_prehook(noop_node)

    published: list[tuple[Any, ...]] = []
    counted: list[int] = []

    def block(mode: str) -> float:
        handles = []
        if mode == "bare":
            for layer in model:
                handles += [layer.register_forward_pre_hook(noop_pre), layer.register_forward_hook(noop_post)]
        tracer: Any = instrument.attach(model, optimizer, endpoint=free_endpoint(), granularity="layer") \
            if mode == "dagtop" else instrument.NullTracer()
        if mode == "dagtop":
            put = tracer._publisher.put_iteration

            def counting(iteration: int, events: list[tuple[Any, ...]], cpu: Any = None) -> None:
                counted.append(len(events))
                published[:] = events
                put(iteration, events, cpu)

            tracer._publisher.put_iteration = counting
        times = []
        last = time.perf_counter()
        for i, (x, y) in enumerate(tracer.loader([(a, b)] * (warmup + steps))):
            x, y = tracer.to_device((x, y), "cpu")
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            if i >= warmup:
                times.append(now - last)
            last = now
        tracer.close()
        for handle in handles:
            handle.remove()
        return statistics.median(times)

    modes = ["none", "bare", "dagtop"]
    rounds: list[dict[str, float]] = []
    for r in range(blocks):
        order = modes[r % 3:] + modes[:r % 3]
        rounds.append({mode: block(mode) for mode in order})
    events = statistics.median(counted)
    # The bare hooks fire once per forward and once per backward of each layer: 2 events' worth per layer.
    bare = _quartiles([(x["bare"] - x["none"]) / (2 * layers) * 1e6 for x in rounds])
    dagtop = _quartiles([(x["dagtop"] - x["none"]) / events * 1e6 for x in rounds])
    return bare, dagtop, int(events), _encoding_cost(published)


def per_bucket_cost(buckets: int = 16, steps: int = 200, repeats: int = 5) -> tuple[float, float]:
    """CPU µs per DDP bucket of dagtop's all-reduce tap: on the training thread (the reducer's call into the tap
    and back) and on gloo's threads (the done callback), at world size 1 (gloo) with one bucket per layer.

    dagtop with its tap against dagtop with the tap taken out, so the hooks cancel; per-step training-thread CPU,
    its tenth percentile, best of ``repeats`` interleaved runs (noise only ever adds); gloo's threads by mean.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(buckets)])
        x = torch.randn(8, 64)

        def run(tapped: bool) -> tuple[float, float]:
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)  # each layer a bucket of its own
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.0)
            tracer: Any = instrument.attach(ddp, optimizer, endpoint=free_endpoint())
            if not tapped:
                tracer._comm.remove()
                tracer._comm = None
            per_step: list[int] = []
            before = thread_cpu()
            for i in range(steps + 10):
                if i == 10:
                    before = thread_cpu()
                start = time.thread_time_ns()
                ddp(x).sum().backward()
                optimizer.step()
                per_step.append(time.thread_time_ns() - start)
            after = thread_cpu()
            tracer.close()
            return sorted(per_step[10:])[steps // 10] / 1e3, (after["gloo"] - before["gloo"]) / steps / 1e3

        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(repeats):
            for tapped in (r % 2 == 0, r % 2 == 1):
                runs[tapped].append(run(tapped))
        main = (min(m for m, _ in runs[True]) - min(m for m, _ in runs[False])) / buckets
        gloo = (statistics.median(g for _, g in runs[True]) - statistics.median(g for _, g in runs[False])) / buckets
        return main, gloo
    finally:
        dist.destroy_process_group()


def _encoding_cost(events: list[tuple[Any, ...]], repeats: int = 200) -> float:
    """The publisher thread's µs per iteration for ``events`` (spans filled, frame encoded): minimum of repeats."""
    from instrument import wire
    from instrument.spans import fill_spans

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        wire.encode_iteration(1, 0, 1, fill_spans(events), 0)
        best = min(best, time.perf_counter_ns() - start)
    return best / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default: about a second of each kind)")
    parser.add_argument("--jobs", nargs="+", default=list(job_kinds.KINDS), choices=job_kinds.KINDS)
    parser.add_argument("--modes", nargs="+", default=["plain", "plain again", "block"], choices=list(MODES))
    parser.add_argument("--no-per-event", action="store_true")
    args = parser.parse_args(argv)
    modes = ["plain", *[m for m in args.modes if m != "plain"]]
    print(f"load average {os.getloadavg()[0]:.2f} at the start; torch {torch.__version__}, {os.cpu_count()} CPUs")
    if not args.no_per_event:
        torch.set_num_threads(1)
        bare, dagtop, events, encode = per_event_cost()
        print(f"per event, training thread (chain of 100 tiny layers, {events} events/step, 1 thread; median of "
              f"paired blocks, IQR): torch's bare hook dispatch {bare[1]:.2f} µs ({bare[0]:.2f}..{bare[2]:.2f}), "
              f"dagtop {dagtop[1]:.2f} µs ({dagtop[0]:.2f}..{dagtop[2]:.2f}) (hooks included)")
        print(f"publisher thread, per iteration of {events} events (spans filled, frame encoded): {encode:.0f} µs")
        main, gloo = per_bucket_cost()
        print(f"per DDP bucket, the all-reduce tap (world size 1, 16 buckets): training thread {main:.1f} µs, "
              f"gloo's threads {gloo:.1f} µs")
    for kind in args.jobs:
        steps = args.steps or STEPS[kind]
        before = os.getloadavg()[0]
        times = interleaved(kind, args.rounds, steps, modes)
        table(kind, times, steps, (before, os.getloadavg()[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
