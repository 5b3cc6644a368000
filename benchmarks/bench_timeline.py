"""The timeline's cost per redraw on a big iteration: 64 ranks of ~430 tasks each (per-layer detail).

    python benchmarks/bench_timeline.py [--ranks 64] [--blocks 200]

The chart paints only the rows that fit, but each of them weighs every task and wait of its rank against the
cells it touches; this is the UI thread's largest single cost on a wide job (bench_ui.py's jobs have ~20 tasks
per rank and do not show it).
"""

from __future__ import annotations

import argparse
import statistics
import time

from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.renderables.timeline import timeline_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    job = SyntheticJob(ranks=args.ranks, blocks=args.blocks, buckets=25, slow_ranks=(5,), slow_category="compute",
                       slow_factor=1.5)
    pipeline = Pipeline(window=None)
    pipeline.feed(synthetic_frames(job, iterations=3, seed=1))
    pipeline.finish()
    analysis = pipeline.analyses()[-1]
    print(f"{len(analysis.tasks)} tasks, {len(analysis.critical_path)} critical-path segments; ms per chart, "
          f"median of {args.repeat}")
    for width, height in ((120, 36), (80, 24), (200, 80)):
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            timeline_rows(analysis, width, height)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"  {width}x{height}: {statistics.median(times):8.1f} ms")


if __name__ == "__main__":
    main()
