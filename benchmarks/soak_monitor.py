"""Soak: the monitor's memory over an hour of a 64-rank job at 5 iterations/s, compressed.

    python benchmarks/soak_monitor.py                      # 64 ranks, 18 000 iterations (an hour of job time)
    python benchmarks/soak_monitor.py --iterations 3000    # a quick look

The monitor's own pipeline (dagtop/model/pipeline.py: admission, assembly, analysis, the snapshot the screen
draws) is fed a synthetic job's real wire frames (dagtop/model/synthetic.py) as fast as it takes them, the job's
clock advancing 200 ms per iteration; a snapshot is taken every iteration, as the live screen does at 5 it/s.
Frames are made in chunks of 100 iterations, so the generator holds little. The resident set size of this
process is sampled every ``--every`` iterations; after the warm-up (the window filling: 120 iterations by
default, and every lazily-built structure), it must stay flat: the last sample within a few MB of the first
one after the warm-up. Prints the samples and the verdict.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import psutil

from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames

CHUNK = 100
PERIOD_NS = 200_000_000
"""One iteration every 200 ms of job time: 5 iterations/s."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=18_000)
    parser.add_argument("--every", type=int, default=1_000, help="sample RSS every N iterations")
    parser.add_argument("--warm-up", type=int, default=1_000, help="iterations before the first sample that counts")
    args = parser.parse_args(argv)
    job = SyntheticJob(ranks=args.ranks, slow_ranks=(3,), slow_category="compute", slow_factor=1.5)
    process = psutil.Process()
    pipeline = Pipeline()
    samples: list[tuple[int, float]] = []
    started = time.perf_counter()
    for first in range(0, args.iterations, CHUNK):
        frames = synthetic_frames(job, iterations=CHUNK, seed=first, start_ns=1_000_000_000 + first * PERIOD_NS,
                                  first_iteration=first, hello=first == 0)
        step = max(1, len(frames) // CHUNK)  # about one iteration of every rank's frames, in arrival order
        for i in range(CHUNK):
            pipeline.feed(frames[i * step:(i + 1) * step] if i < CHUNK - 1 else frames[i * step:])
            pipeline.snapshot()
            done = first + i + 1
            if done % args.every == 0:
                gc.collect()
                samples.append((done, process.memory_info().rss / 2**20))
                rate = done / (time.perf_counter() - started)
                print(f"  iteration {done:6d}: RSS {samples[-1][1]:7.1f} MB ({rate:.0f} iterations/s)",
                      file=sys.stderr)
    counted = [(n, mb) for n, mb in samples if n > args.warm_up]
    if len(counted) < 2:
        print("too few samples after the warm-up: run more iterations")
        return 1
    growth = counted[-1][1] - counted[0][1]
    hours = args.iterations * PERIOD_NS / 3.6e12
    print(f"{args.ranks} ranks, {args.iterations} iterations ({hours:.2f} h of job time at 5 it/s) in "
          f"{time.perf_counter() - started:.0f} s: RSS {counted[0][1]:.1f} MB after the warm-up "
          f"(iteration {counted[0][0]}), {counted[-1][1]:.1f} MB at the end: {growth:+.1f} MB; "
          f"peak {max(mb for _, mb in samples):.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
