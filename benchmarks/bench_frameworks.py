"""What dagtop costs on each framework setup of issue #9: the test jobs of tests/jobs/, plain and timed, interleaved.

    python benchmarks/bench_frameworks.py                      # every setup, 5 rounds (~30 minutes on 2 cores)
    python benchmarks/bench_frameworks.py --only loops --rounds 5

Each round runs a setup's 2-rank gloo job plain (DAGTOP_DISABLE=1), then timed with a monitor listening; the
order alternates between rounds so that neither always runs second. A run's figure is the slower rank's time
from the end of its warm-up (the first ``--warmup`` losses) to its last loss, from the times the jobs note with
each loss (tests/jobs/common.py: ``Losses``); the job's start-up (imports, process group, compilation) is outside
it. "timed/plain" is the median over rounds of each round's ratio, with the lowest and highest round: two runs
seconds apart, so slow drift of the machine cancels. These jobs are tiny (a step is milliseconds to tens of
milliseconds): the shim's per-event cost weighs far more here than on a real model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import Collector  # tests/ holds the job runner and the collector
from ranks import JobRun, run_job

from dagtop.demo.launch import free_endpoint

SETUPS: dict[str, tuple[str, ...]] = {
    "loops plain": ("loops.py", "--mode", "plain", "--steps", "200"),
    "loops closure": ("loops.py", "--mode", "closure", "--steps", "200"),
    "loops accumulate": ("loops.py", "--mode", "accumulate", "--steps", "80"),
    "loops skip (GradScaler)": ("loops.py", "--mode", "skip", "--steps", "200"),
    "loops two optimizers": ("loops.py", "--mode", "two_optimizers", "--steps", "200"),
    "compile DDP(compile(m))": ("compiled.py", "--order", "ddp_compile", "--steps", "150"),
    "compile compile(DDP(m))": ("compiled.py", "--order", "compile_ddp", "--steps", "150"),
    "compile blocks": ("compiled.py", "--order", "blocks", "--steps", "150"),
    "checkpoint reentrant static": ("checkpointed.py", "--checkpoint", "reentrant", "--static-graph", "--steps", "200"),
    "checkpoint non-reentrant": ("checkpointed.py", "--checkpoint", "nonreentrant", "--steps", "200"),
    "FSDP2": ("fsdp.py", "--mode", "fsdp2", "--steps", "60"),
    "HF Trainer": ("hf_trainer.py", "--steps", "40"),
    "Lightning DDP": ("lightning_job.py", "--steps", "90"),
}


def _seconds(run: JobRun, warmup: int) -> float:
    """The slower rank's time from the end of its warm-up to its last loss."""
    assert run.ok and run.times, run.log[-2000:]
    return max(times[-1] - times[warmup - 1] for times in run.times.values())


def _one(args: tuple[str, ...], timed: bool) -> JobRun:
    if not timed:
        return run_job(*args)
    endpoint = free_endpoint()
    collector = Collector(endpoint)
    try:
        return run_job(*args, endpoint=endpoint)
    finally:
        collector.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=4, help="losses left out at the start of each run")
    parser.add_argument("--only", default="", help="setups whose name contains this")
    args = parser.parse_args()
    print(f"{'setup':30} {'plain s':>9} {'timed s':>9} {'timed/plain':>12}  {'rounds (low..high)':>20}", flush=True)
    for name, job in SETUPS.items():
        if args.only not in name:
            continue
        plain, timed, ratios = [], [], []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {mode: _seconds(_one(job, mode), args.warmup) for mode in order}
            plain.append(got[False])
            timed.append(got[True])
            ratios.append(got[True] / got[False])
        print(f"{name:30} {statistics.median(plain):9.3f} {statistics.median(timed):9.3f} "
              f"{(statistics.median(ratios) - 1) * 100:+11.1f}%  "
              f"{(min(ratios) - 1) * 100:+8.1f}..{(max(ratios) - 1) * 100:+.1f}%", flush=True)


if __name__ == "__main__":
    main()
