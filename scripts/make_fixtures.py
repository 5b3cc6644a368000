"""Regenerate the recorded fixtures in dagtop/fixtures/ by running the real demo job (2 ranks, CPU, gloo).

    python scripts/make_fixtures.py            # all of them, ~1 minute on 2 cores
    python scripts/make_fixtures.py io compute # only these
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dagtop.demo.launch import DemoJob, free_endpoint, record_demo

FIXTURES = Path(__file__).resolve().parent.parent / "dagtop" / "fixtures"

SCENARIOS: dict[str, dict[str, object]] = {
    "none": {"bottleneck": "none"},
    "io": {"bottleneck": "io"},
    "compute": {"bottleneck": "compute"},
    "allreduce": {"bottleneck": "allreduce"},
    "straggler1-io": {"bottleneck": "io", "straggler": 1},
    "advice": {"bottleneck": "io"},
}
"""Name → the demo's settings. ``advice`` is the io job recorded by a shim that sends the DataLoader's settings and
the buckets' parameter sizes (what the advice screen needs; the older fixtures predate them)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"some of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.scenarios or SCENARIOS:
        path = FIXTURES / f"demo-{name}.dagtop"
        job = DemoJob(free_endpoint(), ranks=args.ranks, **SCENARIOS[name])  # type: ignore[arg-type]
        status = record_demo(job, path, args.iterations)
        print(f"{path.name}: {'ok' if status == 0 else 'FAILED'}, {path.stat().st_size // 1024} KiB", flush=True)
        failed += status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
