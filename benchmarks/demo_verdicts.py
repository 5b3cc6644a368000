"""Does each demo's bottleneck come out *first* on the critical path, and by how much? A quiet machine's check.

The tests assert only what holds by a wide margin on a loaded CI runner (the slowed category's large share, the
straggler). Which category comes first is a matter of speed: io is a sleep, while compute and gloo's all-reduce
share the CPUs, so a busy machine swells them and a 50/50 race can tip. This records each demo and prints its
shares, the runner-up and the margin; the exit status is 1 if any demo's verdict is not the one it was made for.

    python benchmarks/demo_verdicts.py [--iterations 20]     # about a minute and a half on 2 idle cores
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dagtop.commands.report import select
from dagtop.demo.launch import DemoJob, free_endpoint, record_demo
from dagtop.io.folded import load
from dagtop.model.summary import summarize

DEMOS: list[tuple[str, dict[str, object], str]] = [
    ("--bottleneck io", {"bottleneck": "io"}, "io"),
    ("--straggler 1 --bottleneck io", {"bottleneck": "io", "straggler": 1}, "io"),
    ("--bottleneck compute", {"bottleneck": "compute"}, "compute"),
    ("--bottleneck allreduce", {"bottleneck": "allreduce"}, "allreduce"),
]
"""(the flags as typed, DemoJob's arguments for them, the category the demo is made to put first)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dagtop-verdicts-"))
    missed = 0
    for i, (flags, options, expected) in enumerate(DEMOS):
        path = tmp / f"demo{i}.dagtop"
        if record_demo(DemoJob(free_endpoint(), **options), path, args.iterations) != 0:  # type: ignore[arg-type]
            print(f"{flags:<32} the demo failed")
            missed += 1
            continue
        summary = summarize(select(load(str(path))[0].analyses(), None))
        shares = sorted(summary["critical_path"].items(), key=lambda kv: kv[1], reverse=True)
        (first, top), (second, runner_up) = shares[0], shares[1]
        ok = first == expected
        missed += not ok
        print(f"{flags:<32} {'ok  ' if ok else 'MISS'} {first} {top * 100:3.0f} % · {second} {runner_up * 100:3.0f} %"
              f" · margin {(top - runner_up) * 100:3.0f} points · {summary['iteration_ms']['median']:.0f} ms/it")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
