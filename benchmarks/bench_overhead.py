"""What the shim costs a training job: 2-rank gloo DDP with and without dagtop, and µs per event.

    python benchmarks/bench_overhead.py                        # 15 rounds of both jobs, ~10 minutes on 2 cores
    python benchmarks/bench_overhead.py --rounds 3 --steps 10  # a quick look
    python benchmarks/bench_overhead.py --jobs mlp             # one job

Two jobs, each two ranks on this machine (gloo, one torch thread per rank, each rank pinned to a core), each rank
one process that runs every mode in turn on the same model: a fresh ``DistributedDataParallel`` per run, modes
rotated every round so no mode always runs first, and the slower rank's median step kept. The jobs:

* ``cnn``, compute-heavy: the demo's CNN (dagtop/demo/job.py) at its batch of 64, small gradients;
* ``mlp``, communication-heavy: a 10 M-parameter MLP at batch 2 (40 MB of gradients, ~40 % of the step in the
  all-reduce), the job of issue #10.

Modes: ``plain`` is DDP with its built-in C++ all-reduce — the baseline; ``allreduce_hook`` is PyTorch's Python
``default_hooks.allreduce_hook`` registered as a comm hook (what a comm-hook timer pays at least, for
reference); ``block``, ``layer``, ``layer 1 in 10`` are dagtop's granularities. Nothing listens on the
endpoint: the publisher still encodes and sends every frame, so its thread's share of the cores is in the
figures. "paired" is the median over rounds of each round's mode/plain ratio (seconds apart, so drift cancels),
with its interquartile range. Two of them: the slower rank's median step (what the job feels, and what a shared
VM's scheduler blurs by a few percent either way), and both ranks' CPU seconds per step over all their threads
(what the shim adds in work, which waiting and preemption do not inflate).

Per event: a chain of 100 tiny layers where hooks are nearly all the work (minimum over repeats: noise only ever
adds): torch's bare hook dispatch (no-op forward pre/post hooks and a no-op autograd-node prehook per layer, the
hooks dagtop installs) next to dagtop's per-layer timing, each as training-thread µs per event.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import instrument
from dagtop.demo.launch import free_endpoint, free_port

MODES: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "allreduce_hook": None,
    "block": {"granularity": "block"},
    "block, publisher at nice 0": {"granularity": "block"},
    "layer 1 in 10": {"granularity": "block", "sample_every": 10},
    "layer": {"granularity": "layer"},
}
WARMUP = 3


def _mlp() -> nn.Module:
    width = 2236  # two 2236×2236 layers: 10.0 M parameters
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def _job(name: str, steps: int) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    if name == "cnn":
        from dagtop.demo.job import BATCH, IMAGE, make_model

        model = make_model(wide=False)
        return model, [(torch.randn(BATCH, 3, IMAGE, IMAGE), torch.randint(10, (BATCH,))) for _ in range(steps)]
    return _mlp(), [(torch.randn(2, 256), torch.randint(10, (2,))) for _ in range(steps)]


def _run(model: nn.Module, mode: str, batches: list[Any]) -> tuple[float, float]:
    """This rank's median seconds per step after the warm-up, and its CPU seconds per step (all its threads)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    if mode == "allreduce_hook":
        ddp.register_comm_hook(dist.group.WORLD, allreduce_hook)
    options = MODES[mode]
    from instrument import publisher

    publisher.BACKGROUND_NICE = None if mode == "block, publisher at nice 0" else 19
    tracer: Any = instrument.NullTracer() if options is None else instrument.attach(
        ddp, optimizer, endpoint=free_endpoint(), **options)
    loss_fn = nn.CrossEntropyLoss()
    stamps, cpu = [], 0.0
    for i, batch in enumerate(tracer.loader(batches)):
        stamps.append(time.perf_counter())
        if i == WARMUP:
            cpu = time.process_time()
        x, y = tracer.to_device(batch, "cpu")
        loss = loss_fn(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    stamps.append(time.perf_counter())
    cpu = (time.process_time() - cpu) / (len(batches) - WARMUP)
    tracer.close()
    # The median step, not the mean: a step the VM's scheduler stalled says nothing about the mode.
    return statistics.median(b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1:])), cpu


def _rank(rank: int, port: int, job: str, rounds: int, steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DAGTOP_TELEMETRY="0")
    torch.set_num_threads(1)
    if len(os.sched_getaffinity(0)) >= 2:  # a core each: the shim's threads compete with their own rank only
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model, batches = _job(job, steps + WARMUP)
    rows = []
    for r in range(rounds):
        order = list(MODES)
        order = order[r % len(order):] + order[: r % len(order)]
        for mode in order:
            dist.barrier()
            seconds, cpu = _run(model, mode, batches)
            slower, both = torch.tensor([seconds], dtype=torch.float64), torch.tensor([cpu], dtype=torch.float64)
            dist.all_reduce(slower, op=dist.ReduceOp.MAX)
            dist.all_reduce(both, op=dist.ReduceOp.SUM)
            rows.append(f"{r}\t{mode}\t{slower.item()!r}\t{both.item()!r}")
        if rank == 0:
            print(f"  {job}: round {r + 1}/{rounds}", file=sys.stderr, end="\r")
    if rank == 0:
        Path(out).write_text("\n".join(rows))
    dist.destroy_process_group()


def interleaved(job: str, rounds: int, steps: int) -> dict[str, list[tuple[float, float]]]:
    """Per mode and round, the slower rank's median step and both ranks' CPU seconds per step, in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rows.tsv")
        mp.start_processes(_rank, args=(free_port(), job, rounds, steps, out), nprocs=2, start_method="spawn")
        times: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        for line in Path(out).read_text().splitlines():
            _, mode, seconds, cpu = line.split("\t")
            times[mode].append((float(seconds), float(cpu)))
    return times


def _paired(values: list[float], plain: list[float]) -> str:
    """The median over rounds of the mode/plain ratio, with its interquartile range."""
    ratios = [(t / p - 1) * 100 for t, p in zip(values, plain)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return f"{statistics.median(ratios):+.2f}% ({q1:+.2f}..{q3:+.2f})"


def table(job: str, times: dict[str, list[tuple[float, float]]], steps: int) -> None:
    plain = [step for step, _ in times["plain"]]
    plain_cpu = [cpu for _, cpu in times["plain"]]
    print(f"{job}: {len(plain)} interleaved rounds of {steps} steps, 2 ranks (gloo, 1 thread each, a core each):")
    print(f"  {'mode':<16} {'step ms':>8} {'min..max ms':>13} {'step, paired vs plain (IQR)':>29} {'CPU ms':>7}"
          f" {'CPU, paired vs plain (IQR)':>28}")
    for mode, rounds in times.items():
        steps_s, cpus = [step for step, _ in rounds], [cpu for _, cpu in rounds]
        spread = f"{min(steps_s) * 1e3:.1f}..{max(steps_s) * 1e3:.1f}"
        print(f"  {mode:<16} {statistics.median(steps_s) * 1e3:8.2f} {spread:>13} {_paired(steps_s, plain):>29}"
              f" {statistics.median(cpus) * 1e3:7.2f} {_paired(cpus, plain_cpu):>28}")
    if "block, publisher at nice 0" in times:  # the publisher thread's niceness, the one difference
        niced, not_niced = times["block"], times["block, publisher at nice 0"]
        print(f"  block (publisher at nice {19}) vs block with it at nice 0: step "
              f"{_paired([s for s, _ in niced], [s for s, _ in not_niced])}, CPU "
              f"{_paired([c for _, c in niced], [c for _, c in not_niced])}")
    print("  step: the slower rank's median step; CPU: both ranks' CPU time per step, every thread (the shim's "
          "publisher included)")


def per_event_cost(layers: int = 100, steps: int = 100, repeats: int = 7) -> tuple[float, float, int, float]:
    """Training-thread µs per event: torch's bare hook dispatch, and dagtop's per-layer timing (both against no
    hooks; minimum of repeats); the events per step; the publisher thread's µs to encode one such step."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
    batches = [(torch.randn(2, 4), torch.randn(2, 4))] * (steps + 10)

    def noop_node(*_: Any) -> None:
        return None

    def noop_pre(module: nn.Module, args: Any) -> None:
        return None

    def noop_post(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        output.grad_fn.register_prehook(noop_node)

    def run(mode: str) -> tuple[float, float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        handles = []
        if mode == "bare":
            for layer in model:
                handles += [layer.register_forward_pre_hook(noop_pre), layer.register_forward_hook(noop_post)]
        tracer: Any = instrument.attach(model, optimizer, endpoint=free_endpoint(), granularity="layer") \
            if mode == "dagtop" else instrument.NullTracer()
        counted: list[int] = []
        if mode == "dagtop":
            put = tracer._publisher.put_iteration

            def counting(iteration: int, events: list[tuple[Any, ...]]) -> None:
                counted.append(len(events))
                published[:] = events
                put(iteration, events)

            tracer._publisher.put_iteration = counting
        start = 0.0
        for i, (a, b) in enumerate(tracer.loader(batches)):
            if i == 10:
                start = time.perf_counter()
            a, b = tracer.to_device((a, b), "cpu")
            loss = nn.functional.mse_loss(model(a), b)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        tracer.close()
        for handle in handles:
            handle.remove()
        return (time.perf_counter() - start) / steps, statistics.mean(counted) if counted else 0.0

    published: list[tuple[Any, ...]] = []
    plain, bare, timed, events = [], [], [], 0.0
    for _ in range(repeats):
        plain.append(run("none")[0])
        bare.append(run("bare")[0])
        seconds, events = run("dagtop")
        timed.append(seconds)
    # The bare hooks fire once per forward and once per backward of each layer: 2 events' worth per layer.
    per_bare = (min(bare) - min(plain)) / (2 * layers) * 1e6
    per_dagtop = (min(timed) - min(plain)) / events * 1e6
    return per_bare, per_dagtop, int(events), _encoding_cost(published)


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
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--jobs", nargs="+", default=["cnn", "mlp"], choices=["cnn", "mlp"])
    parser.add_argument("--no-per-event", action="store_true")
    args = parser.parse_args(argv)
    if not args.no_per_event:
        torch.set_num_threads(1)
        bare, dagtop, events, encode = per_event_cost()
        print(f"per event, training thread (chain of 100 tiny layers, {events} events/step, 1 thread): "
              f"torch's bare hook dispatch {bare:.2f} µs, dagtop {dagtop:.2f} µs (hooks included)")
        print(f"publisher thread, per iteration of {events} events (spans filled, frame encoded): {encode:.0f} µs")
    for job in args.jobs:
        table(job, interleaved(job, args.rounds, args.steps), args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
