"""What timing FSDP2's collectives costs: the 2-rank gloo job of tests/jobs/fsdp.py, plain and timed, interleaved;
and µs per timed collective.

    python benchmarks/bench_fsdp.py                       # 4 rounds of 30 steps, ~6 minutes on 2 cores
    python benchmarks/bench_fsdp.py --rounds 2 --steps 12 --width 256

Each round runs the job plain (DAGTOP_DISABLE=1) then timed, with a monitor listening; a run's figure is the
median over its steps (the first two left out) of the slower rank's step time. "paired" is the median over rounds
of each round's timed/plain ratio, so that drift between rounds cancels. The per-collective figure is the
wrapper alone around a collective that does nothing (minimum over repeats: noise only ever adds).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import Collector  # tests/ holds the job runner and the collector
from ranks import run_job

from dagtop.demo.launch import free_endpoint

WARMUP = 2


def _step_ms(log: str) -> float:
    """The median over steps (warm-up left out) of the slower rank's step, from the times the ranks print."""
    times = {int(rank): json.loads(values) for rank, values in re.findall(r"step seconds of rank (\d+): (\[[^\]]*\])",
                                                                           log)}
    steps = list(zip(*(times[r] for r in sorted(times))))
    return statistics.median(max(s) for s in steps[WARMUP:]) * 1e3


def _job(args: argparse.Namespace, timed: bool) -> float:
    extra = ["--steps", str(args.steps), "--width", str(args.width), "--layers", str(args.layers)]
    if not timed:
        run = run_job("fsdp.py", *extra)
    else:
        endpoint = free_endpoint()
        collector = Collector(endpoint)
        try:
            run = run_job("fsdp.py", *extra, endpoint=endpoint)
            collector.until_bye(2)
        finally:
            collector.stop()
    if not run.ok:
        raise SystemExit(run.log)
    return _step_ms(run.log)


def per_collective_us(repeats: int = 5, calls: int = 20_000) -> float:
    """The timed wrapper around a collective that does nothing, on a 1-rank gloo group: µs per call."""
    import torch
    import torch.distributed as dist

    from instrument.fsdp import TimedAllGather, _Names
    from instrument.probe import Probe, Switch

    class NoGather:
        def __call__(self, **kwargs: object) -> None:
            return None

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    events: list[tuple[object, ...]] = []
    names = _Names(lambda: len(events) // 64)  # a new "iteration" every 64 collectives, as a model's would be
    timed = TimedAllGather(NoGather(), "all-gather layers.0", names,
                           Probe(events.append, time.perf_counter_ns, "comm", Switch(), lambda exc: None))
    out, inp = torch.empty(1024), torch.empty(512)
    group = dist.group.WORLD
    plain = NoGather()
    best = float("inf")
    for _ in range(repeats):
        events.clear()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            timed(output_tensor=out, input_tensor=inp, group=group)
        t1 = time.perf_counter_ns()
        for _ in range(calls):
            plain(output_tensor=out, input_tensor=inp, group=group, async_op=False)
        t2 = time.perf_counter_ns()
        best = min(best, ((t1 - t0) - (t2 - t1)) / calls / 1e3)
    dist.destroy_process_group()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    args = parser.parse_args()
    print(f"per timed collective: {per_collective_us():.2f} µs (wrapper alone, minimum of 5 × 20000 calls)")
    plain, timed = [], []
    for i in range(args.rounds):
        plain.append(_job(args, timed=False))
        timed.append(_job(args, timed=True))
        print(f"round {i + 1}: plain {plain[-1]:.1f} ms/step, timed {timed[-1]:.1f} ms/step", flush=True)
    ratios = sorted(t / p for p, t in zip(plain, timed))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"plain {statistics.median(plain):.1f} ms/step, timed {statistics.median(timed):.1f} ms/step; paired "
          f"{(statistics.median(ratios) - 1) * 100:+.1f} % (interquartile {(q[0] - 1) * 100:+.1f} .. "
          f"{(q[2] - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
