"""Every change dagtop advises, against the job re-run with the change made for real.

For each job kind of benchmarks/advice_jobs.py (written for this, not the demo): the job is recorded with dagtop
on (``dagtop record``'s path: bind, start, record), advised (:func:`dagtop.model.advice.advise_snapshot`, what
``dagtop advise`` prints), then re-run with dagtop off and the advised changes made for real inside the one job:
the job as it was and each change take turns every few steps (two DDP copies with different buckets, a second
DataLoader, DDP's compress hook, ``no_sync`` micro-batches, the hog stopped with SIGSTOP), so the machine's load
falls on all of them alike. The measured gain of a change is the median over block pairs of (samples/s with the
change) / (samples/s as it was) in the adjacent block, with the block pairs' interquartile range as its spread.

Target (issue #26): each predicted gain within ±10 % of the measured (relative, on the throughput ratio), or
within 1 point of step time where the measured gain is under 10 %; the advice's best change the truly best of
those re-run in ≥ 90 % of the jobs.

Run: ``flock /tmp/dagtop-bench.lock python benchmarks/validate_advice.py [--only JOB] [--rounds 1]``; prints the
table and writes it as JSON with ``--json FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagtop.demo.launch import DemoJob, free_endpoint, record_demo
from dagtop.model.advice import Advice, Candidate, Kind, advise_snapshot
from dagtop.report import load

JOBS_SCRIPT = str(Path(__file__).with_name("advice_jobs.py"))
RECORD_ITERATIONS = 40
"""Iterations recorded: warm-up plus the verdict's window of 20 and some."""
TOP = 3
"""Changes re-run per job: the advice's best few (that the job can make)."""


@dataclass(frozen=True)
class JobKind:
    name: str
    args: tuple[str, ...]


JOBS = (
    JobKind("mlp, default buckets", ("--job", "mlp")),
    JobKind("mlp, tiny buckets", ("--job", "mlp", "--bucket-cap", "0.25")),
    JobKind("loader, num_workers=0", ("--job", "loader", "--width", "512", "--depth", "4", "--io-ms", "1.0")),
    JobKind("rank 1 with a CPU hog", ("--job", "hog", "--width", "512", "--depth", "6")),
    JobKind("transformer", ("--job", "transformer", "--width", "256", "--depth", "4", "--batch", "16")),
)


class Ranks(DemoJob):
    """The 2 ranks of an advice job, launched as the demo's are (own sessions, stopped with the monitor)."""

    def __init__(self, args: list[str], **kw: Any) -> None:
        super().__init__(free_endpoint(), **kw)
        self.args = args

    def command(self) -> list[str]:
        return [sys.executable, JOBS_SCRIPT, *self.args]


def advised(job: JobKind, path: Path) -> Advice:
    """Record the job with dagtop on and advise on the recording."""
    rc = record_demo(Ranks([*job.args, "--iterations", str(RECORD_ITERATIONS + 20)]), path, RECORD_ITERATIONS)
    if rc != 0:
        sys.exit(f"validate_advice: recording {job.name} failed ({rc})")
    pipeline, _ = load(str(path))
    return advise_snapshot(pipeline.snapshot())


def arm_of(c: Candidate, job: JobKind) -> str | None:
    """The job's ``--arms`` entry that makes ``c`` for real, or None where this job cannot."""
    s = c.setting
    if c.kind is Kind.BUCKETS:
        if "bucket_cap_mb_list" in s:
            return "caps=" + ":".join(f"{x:g}" for x in s["bucket_cap_mb_list"])
        return f"cap={s['bucket_cap_mb']:g}" if "bucket_cap_mb" in s else ("cap=default" if c.speedup != 1.0 else None)
    if c.kind is Kind.LOADER:
        return f"workers={s['num_workers']}"
    if c.kind is Kind.COMPRESSION:
        return "hook=" + str(s["comm_hook"])[:4]
    if c.kind is Kind.ACCUMULATION:
        return f"accumulate={s['accumulate']}"
    if c.kind is Kind.STRAGGLER and "--job" in job.args and job.args[job.args.index("--job") + 1] == "hog":
        return "hog=off"
    return None


def truth(job: JobKind, arms: list[str], blocks: int, out: Path) -> dict[str, dict[str, float]]:
    """Re-run the job with dagtop off and the arms taking turns; per arm its measured throughput gain."""
    ranks = Ranks([*job.args, "--arms", ",".join(["base", *arms]), "--blocks", str(blocks), "--out", str(out)],
                  extra_env={"DAGTOP_DISABLE": "1"})
    ranks.start()
    if not ranks.wait(1800):
        ranks.stop()
        sys.exit(f"validate_advice: the re-run of {job.name} did not finish; log {ranks.log_path}")
    ranks.stop()
    if not out.exists():
        sys.exit(f"validate_advice: the re-run of {job.name} wrote nothing; log {ranks.log_path}:\n{ranks.log_tail()}")
    data = json.loads(out.read_text())["arms"]
    base = data["base"]
    block = len(base["step_ms"]) // blocks
    rows = {}
    for arm in arms:
        mine = data[arm]
        ratios = []
        for i in range(blocks):
            b = statistics.median(base["step_ms"][i * block:(i + 1) * block])
            m = statistics.median(mine["step_ms"][i * block:(i + 1) * block])
            ratios.append((mine["samples_per_step"] / m) / (base["samples_per_step"] / b))
        q = statistics.quantiles(ratios, n=4)
        rows[arm] = {"measured": statistics.median(ratios), "q1": q[0], "q3": q[2],
                     "base_ms": statistics.median(base["step_ms"]), "arm_ms": statistics.median(mine["step_ms"])}
    return rows


def within(predicted: float, measured: float) -> bool:
    """The target: ±10 % of the measured throughput ratio; where the measured gain is under 10 %, ±1 point of
    step time (the step time as a share of the step now: 1/throughput)."""
    if measured >= 1.10:
        return abs(predicted / measured - 1) <= 0.10
    return abs(1 / predicted - 1 / measured) <= 0.01


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the jobs whose name contains this text")
    parser.add_argument("--blocks", type=int, default=12, help="blocks per arm in the re-run")
    parser.add_argument("--rounds", type=int, default=1, help="record, advise and re-run this many times per job")
    parser.add_argument("--json", default="", help="also write the rows here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dagtop-advice-"))
    table: list[dict[str, Any]] = []
    print(f"{'job':<24} {'candidate':<34} {'predicted':>9} {'measured':>9} {'spread':>13} {'error':>7} ok  best")
    for n, job in enumerate(j for j in JOBS if args.only in j.name):
        for r in range(args.rounds):
            advice = advised(job, tmp / f"{n}-{r}.dagtop")
            print(f"{job.name:<24} {advice.headline()}  (load {os.getloadavg()[0]:.1f})", flush=True)
            if advice.held:
                continue
            chosen = [(c, a) for c in advice.fixes if (a := arm_of(c, job)) is not None][:TOP]
            if not chosen:
                continue
            measured = truth(job, [a for _, a in chosen], args.blocks, tmp / f"{n}-{r}.json")
            truly = max(chosen, key=lambda ca: measured[ca[1]]["measured"])[0]
            for c, arm in chosen:
                m = measured[arm]
                p = c.throughput or 0.0
                ok = within(p, m["measured"])
                row = {"job": job.name, "round": r, "candidate": c.title, "kind": str(c.kind), "arm": arm,
                       "predicted": p, "confidence": str(c.confidence), **m, "ok": ok,
                       "advised_best": c is advice.fixes[0], "truly_best": c is truly}
                table.append(row)
                mark = ("advised" if row["advised_best"] else "") + (" measured" if row["truly_best"] else "")
                print(f"{'':<24} {c.title[:34]:<34} {p:>8.3f}× {m['measured']:>8.3f}× "
                      f"{m['q1']:>6.3f}–{m['q3']:<6.3f} {(p / m['measured'] - 1) * 100:>+6.1f}% {'✓' if ok else '✗'}  "
                      f"{mark}", flush=True)
    jobs = {(row["job"], row["round"]) for row in table}
    right = sum(1 for j in jobs if any(row["advised_best"] and row["truly_best"] for row in table
                                       if (row["job"], row["round"]) == j))
    ok = sum(row["ok"] for row in table)
    print(f"\n{ok} of {len(table)} predictions within target; the advised best truly best in {right} of {len(jobs)} "
          f"jobs; load {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
