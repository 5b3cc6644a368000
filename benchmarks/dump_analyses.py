"""Dump every analysis the model makes of a fixed set of inputs, to prove a refactor changed nothing.

    python benchmarks/dump_analyses.py /tmp/before          # on the old code
    python benchmarks/dump_analyses.py /tmp/after           # on the new code
    python benchmarks/dump_analyses.py --compare /tmp/before /tmp/after

Inputs: the five bundled recordings (folded whole, as ``dagtop report`` does, and through a live-sized window)
and synthetic jobs (balanced, stragglers in each category, many ranks, a tight task budget). Every analysis is
written as canonical JSON: records by field name with sorted keys, floats by ``repr``, so a change of field
order or of record type (a tuple become a dataclass) does not count as a difference; a changed value does.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dagtop.commands import report
from dagtop.io.recording import RecordingReader
from dagtop.model import pipeline as pipeline_module
from dagtop.model.pipeline import Pipeline
from dagtop.model.summary import summarize
from dagtop.model.synthetic import SyntheticJob, synthetic_frames

FIXTURES = Path(__file__).resolve().parent.parent / "dagtop" / "fixtures"

SYNTHETIC = {
    "balanced": SyntheticJob(),
    "straggler-io": SyntheticJob(ranks=4, slow_ranks=(2,), slow_category="io"),
    "straggler-compute": SyntheticJob(ranks=4, slow_ranks=(1,), slow_category="compute", slow_factor=1.8),
    "straggler-pcie": SyntheticJob(ranks=3, slow_ranks=(0,), slow_category="pcie", slow_factor=20.0),
    "comm-bound": SyntheticJob(ranks=8, allreduce_ms_per_mb=4.0),
    "layers": SyntheticJob(ranks=2, blocks=40, buckets=12),
}


def canonical(x: Any) -> Any:
    """A JSON-able form that depends on values and field names only."""
    if isinstance(x, enum.Enum):
        return x.name
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: canonical(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {name: canonical(getattr(x, name)) for name in x._fields}
    if isinstance(x, Mapping):
        return {str(k): canonical(v) for k, v in x.items()}
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):  # lists, tuples, the model's Tasks
        return [canonical(v) for v in x]
    if isinstance(x, float):
        return repr(x)
    if hasattr(x, "item"):  # a numpy scalar
        return canonical(x.item())
    return x


def _fold(frames: list[Any], window: int | None) -> Pipeline:
    p = Pipeline(window=window)
    for i in range(0, len(frames), 64):  # batches, as the collector feeds them
        p.feed(frames[i:i + 64])
    p.finish()
    return p


def cases() -> dict[str, tuple[list[Any], int | None]]:
    out: dict[str, tuple[list[Any], int | None]] = {}
    for path in sorted(FIXTURES.glob("*.dagtop")):
        frames = list(RecordingReader(str(path)))
        out[f"{path.stem}-whole"] = (frames, None)
        out[f"{path.stem}-window"] = (frames, 8)
    for name, job in SYNTHETIC.items():
        out[f"synthetic-{name}"] = (synthetic_frames(job, iterations=12, seed=7), None)
    return out


def dump(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    for name, (frames, window) in cases().items():
        p = _fold(frames, window)
        analyses = p.analyses()
        snap = p.snapshot()
        doc = {
            "analyses": [canonical(a) for a in analyses],
            "summary": canonical(summarize(report.select(analyses, None))) if analyses else None,
            "snapshot": canonical(dataclasses.replace(snap, iterations=(), telemetry=())),
        }
        (directory / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
        count += len(analyses)
        print(f"{name:<36} {len(analyses):4d} analyses")
    # A budget small enough that the oldest analyses give up their tasks.
    saved = pipeline_module.TASK_BUDGET
    pipeline_module.TASK_BUDGET = 500
    try:
        p = _fold(synthetic_frames(SyntheticJob(ranks=4, blocks=20), iterations=12, seed=3), 6)
        (directory / "synthetic-budget.json").write_text(
            json.dumps([canonical(a) for a in p.analyses()], indent=1, sort_keys=True))
        count += len(p.analyses())
        print(f"{'synthetic-budget':<36} {len(p.analyses()):4d} analyses")
    finally:
        pipeline_module.TASK_BUDGET = saved
    print(f"{count} analyses dumped to {directory}")
    return 0


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    differ = [n for n in names if not (before / n).is_file() or not (after / n).is_file()
              or json.loads((before / n).read_text()) != json.loads((after / n).read_text())]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names) - len(differ)} of {len(names)} dumps identical")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--compare", action="store_true", help="compare two dump directories")
    args = parser.parse_args(argv)
    if args.compare:
        if len(args.dirs) != 2:
            parser.error("--compare takes two directories")
        return compare(*args.dirs)
    return dump(args.dirs[0])


if __name__ == "__main__":
    sys.exit(main())
