"""What the shim costs a training rank: instrumented vs plain steps of the demo model, and µs per event.

    python benchmarks/bench_overhead.py                 # ~2 minutes on 2 cores
    python benchmarks/bench_overhead.py --rounds 3 --steps 10   # a quick look

Runs are interleaved (plain, block, layer, sampled, plain, ...) and summarised by medians, because this
kind of VM drifts by several percent from minute to minute (FIELD_NOTES). Nothing listens on the endpoint:
the publisher still encodes and sends every frame, so its thread's share of the GIL is in the figures.
The per-event figure is the steadier one: a chain of tiny layers where hooks are nearly all the work,
timed as the minimum over repeats (noise only ever adds). The "estimated" column multiplies it by the
events each mode produces per step. "paired" is the median over rounds of each round's mode/plain ratio (the
two ran minutes apart at most, so slow drift cancels), with its interquartile range: when that range spans
zero, the overhead is below what this machine can measure directly and the estimate is the figure to trust.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import instrument
from dagtop.demo.job import BATCH, IMAGE, make_model
from dagtop.demo.launch import free_endpoint

MODES: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "block": {"granularity": "block"},
    "block, layer 1 in 10": {"granularity": "block", "sample_every": 10},
    "layer": {"granularity": "layer"},
}


def _step_time(model: nn.Module, options: dict[str, Any] | None, batches: list[Any], warmup: int) -> tuple[float, float]:
    """(mean seconds per training step, events per step) over ``batches`` after ``warmup`` untimed steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    tracer: Any = instrument.NullTracer() if options is None else instrument.attach(
        model, optimizer, endpoint=free_endpoint(), **options)
    counted = _count_events(tracer)
    start = 0.0
    for i, batch in enumerate(tracer.loader(batches)):
        if i == warmup:
            start = time.perf_counter()
        x, y = tracer.to_device(batch, "cpu")
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    elapsed = (time.perf_counter() - start) / (len(batches) - warmup)
    tracer.close()
    return elapsed, statistics.mean(counted) if counted else 0.0


def _count_events(tracer: Any) -> list[int]:
    """Note the number of events of every iteration the tracer publishes."""
    counted: list[int] = []
    if isinstance(tracer, instrument.Tracer):
        put = tracer._publisher.put_iteration
        tracer._publisher.put_iteration = lambda it, ev: (counted.append(len(ev)), put(it, ev))  # type: ignore
    return counted


def interleaved(rounds: int, steps: int, make: Callable[[], nn.Module], batches: list[Any]
                ) -> dict[str, tuple[list[float], float]]:
    """Per mode: the step time of every round, and the events per step."""
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    events: dict[str, float] = {}
    model = make()
    for r in range(rounds):
        order = list(MODES)
        order = order[r % len(order):] + order[: r % len(order)]  # rotate: no mode always runs first
        for mode in order:
            seconds, events[mode] = _step_time(model, MODES[mode], batches[: steps + 3], warmup=3)
            times[mode].append(seconds)
        print(f"  round {r + 1}/{rounds}", file=sys.stderr, end="\r")
    return {mode: (times[mode], events[mode]) for mode in MODES}


def per_event_cost(layers: int = 100, steps: int = 100, repeats: int = 7) -> tuple[float, int]:
    """Training-thread µs per event: a chain of tiny layers, per-layer timing on vs off (minimum of repeats)."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
    batches = [(torch.randn(2, 4), torch.randn(2, 4))] * (steps + 10)

    def run(options: dict[str, Any] | None) -> tuple[float, float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        tracer: Any = instrument.NullTracer() if options is None else instrument.attach(
            model, optimizer, endpoint=free_endpoint(), **options)
        counted = _count_events(tracer)
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
        return (time.perf_counter() - start) / steps, statistics.mean(counted) if counted else 0.0

    plain, timed, events = [], [], 0.0
    for _ in range(repeats):
        plain.append(run(None)[0])
        seconds, events = run({"granularity": "layer"})
        timed.append(seconds)
    return (min(timed) - min(plain)) / events * 1e6, int(events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as each demo rank)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = [(torch.randn(BATCH, 3, IMAGE, IMAGE), torch.randint(10, (BATCH,))) for _ in range(args.steps + 3)]
    cost, chain_events = per_event_cost()
    results = interleaved(args.rounds, args.steps, lambda: make_model(wide=False), batches)
    plain = statistics.median(results["plain"][0])
    print(f"demo model (DemoNet, batch {BATCH}, {args.threads} thread), {args.rounds} interleaved rounds "
          f"of {args.steps} steps:")
    print(f"  {'mode':<22} {'events':>6} {'median ms':>10} {'min..max ms':>14} {'measured':>9} "
          f"{'paired (IQR)':>24} {'estimated':>10}")
    plain_times = results["plain"][0]
    for mode, (times, events) in results.items():
        median = statistics.median(times)
        spread = f"{min(times) * 1e3:.1f}..{max(times) * 1e3:.1f}"
        estimated = cost * 1e-6 * events / plain * 100
        ratios = [(t / p - 1) * 100 for t, p in zip(times, plain_times)]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        paired = f"{statistics.median(ratios):+.2f}% ({q1:+.2f}..{q3:+.2f})"
        print(f"  {mode:<22} {events:6.0f} {median * 1e3:10.2f} {spread:>14} {(median / plain - 1) * 100:+8.2f}% "
              f"{paired:>24} {estimated:+9.2f}%")
    print(f"training-thread cost per event (hook + enqueue; chain of {chain_events} events/step): {cost:.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
