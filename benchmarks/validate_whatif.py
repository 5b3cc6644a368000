"""Every what-if against a real re-run of the same job with the change made for real.

For each case a base run is recorded with dagtop on (``dagtop record`` + the report's what-ifs give the
prediction), then the same job is run with dagtop off (``DAGTOP_DISABLE=1``) twice, as it is and with the change
made inside the job, each timed by its own clock (rank 0's ``optimizer.step`` returns; median step over the steady
iterations). Predicted speedup (the model: identity replay / scenario) is compared with measured speedup
(unchanged re-run / changed re-run), so that a machine busier in one run than another moves both sides alike.
The changed job is also recorded with dagtop on ("dagtop on": base recording / changed recording, medians of the
recorded iterations): the gap between the two measured columns is the instrumentation's own cost, which the
model's base carries and a re-run with dagtop off does not.
Rounds interleave base and re-runs; the table gives medians over rounds and the spread of the measured speedup.

Changes, made in the rank process by code run before the job's ``main`` (nothing in the repository changes):

* perfect overlap: ``ddp.register_comm_hook`` with a hook returning the bucket unchanged, as a completed future;
* all-reduce ×0.5: a hook all-reducing only the first half of every bucket (half the bytes, the same compute);
* I/O hidden: the slow loader prefetched by one DataLoader worker (what the model's floor assumes: hidden, but
  never faster than one batch per iteration);
* straggler at median: the slow rank made normal (``--straggler`` dropped);
* 2N workers: not run. Two ranks already take this machine's two cores: four would measure core sharing, not
  the network the α-β model predicts. Said so in the table.

Jobs: the demo (``dagtop.demo.job``) and ``benchmarks/whatif_job.py``, a plain transformer the project did not tune.
Run: ``nice -n 19 python benchmarks/validate_whatif.py [--rounds 3] [--iterations 30]`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagtop.commands.report import select
from dagtop.demo.launch import DemoJob, free_endpoint, record_demo
from dagtop.io.folded import load
from dagtop.model.summary import summarize

STEP_CLOCK = ("import os, time, atexit, torch\n"
              "_steps = []\n"
              "def _clock(cls):\n"
              "    step = cls.step\n"
              "    def timed(self, *a, **k):\n"
              "        r = step(self, *a, **k); _steps.append(time.perf_counter_ns()); return r\n"
              "    cls.step = timed\n"
              "_clock(torch.optim.SGD); _clock(torch.optim.AdamW)\n"
              "if os.environ.get('RANK') == '0' and os.environ.get('VALIDATE_STEPS'):\n"
              "    atexit.register(lambda: open(os.environ['VALIDATE_STEPS'], 'w').write("
              "'\\n'.join(map(str, _steps))))\n")
"""Rank 0 writes the time of every optimizer step's return: the job's own clock."""
_HOOK = ("import torch, torch.distributed as dist\n"
         "_init = torch.nn.parallel.DistributedDataParallel.__init__\n"
         "def _with_hook(self, *a, **k):\n"
         "    _init(self, *a, **k); self.register_comm_hook(None, _hook)\n"
         "torch.nn.parallel.DistributedDataParallel.__init__ = _with_hook\n")
NO_COMM = ("def _hook(state, bucket):\n"
           "    f = torch.futures.Future(); f.set_result(bucket.buffer()); return f\n") + _HOOK
HALF_BYTES = ("def _hook(state, bucket):\n"
              "    buf = bucket.buffer(); n = buf.numel() // 2\n"
              "    work = dist.all_reduce(buf[:n], async_op=True)\n"
              "    return work.get_future().then(lambda f: buf)\n") + _HOOK
PREFETCH = ("import torch.utils.data as d\n"
            "class _Prefetching(d.DataLoader):\n"
            "    def __init__(self, *a, **k):\n"
            "        k['num_workers'] = 1; k['prefetch_factor'] = 2; super().__init__(*a, **k)\n"
            "d.DataLoader = _Prefetching\n")
WARM = 8
"""Steps left out of the own-clock median: start-up, first buckets, allocator warm-up."""


class Job(DemoJob):
    """A 2-rank job launched as the demo is, with a patch run in each rank first and its own args."""

    def __init__(self, module: str, args: list[str], patch: str = "", **kw: Any) -> None:
        super().__init__(free_endpoint(), **kw)
        self.module, self.args, self.patch = module, args, patch

    def command(self) -> list[str]:
        code = (f"{STEP_CLOCK}{self.patch}\nimport sys, runpy\nsys.argv = ['{self.module}', *sys.argv[1:]]\n"
                f"runpy.run_module('{self.module}', run_name='__main__')")
        return [sys.executable, "-c", code, *self.args]


@dataclass(frozen=True)
class Case:
    job: str
    change: str
    module: str
    base_args: list[str]
    rerun_args: list[str]
    patch: str = ""


def cases() -> list[Case]:
    demo, tf = "dagtop.demo.job", "benchmarks.whatif_job"
    ar = ["--bottleneck", "allreduce"]
    return [
        Case("demo allreduce", "perfect overlap", demo, ar, ar, NO_COMM),
        Case("demo allreduce", "all-reduce ×0.5", demo, ar, ar, HALF_BYTES),
        Case("demo io", "I/O hidden", demo, ["--bottleneck", "io"], ["--bottleneck", "io"], PREFETCH),
        Case("demo compute straggler", "straggler at median", demo, ["--bottleneck", "compute", "--straggler", "1"],
             ["--bottleneck", "none"]),
        Case("transformer", "perfect overlap", tf, [], [], NO_COMM),
        Case("transformer", "all-reduce ×0.5", tf, [], [], HALF_BYTES),
        Case("transformer straggler", "straggler at median", tf, ["--slow-rank", "1"], []),
    ]


def own_clock_ms(module: str, args: list[str], patch: str, iterations: int, out: Path) -> float:
    """Median step of rank 0 over the steady steps, dagtop off."""
    job = Job(module, [*args, "--iterations", str(iterations)], patch,
              extra_env={"DAGTOP_DISABLE": "1", "VALIDATE_STEPS": str(out)})
    job.start()
    if not job.wait(300):
        job.stop()
        sys.exit(f"validate_whatif: {module} {args} did not finish; log {job.log_path}")
    job.stop()
    steps = [int(x) for x in out.read_text().split()] if out.exists() else []
    if len(steps) < WARM + 3:
        sys.exit(f"validate_whatif: {module} {args} timed {len(steps)} steps; log {job.log_path}:\n{job.log_tail()}")
    return statistics.median((b - a) / 1e6 for a, b in zip(steps[WARM:], steps[WARM + 1:]))


def recorded(module: str, args: list[str], patch: str, iterations: int, path: Path) -> dict[str, Any]:
    """``dagtop report --json`` of a run recorded with dagtop on."""
    rc = record_demo(Job(module, args, patch), path, iterations)
    if rc != 0:
        sys.exit(f"validate_whatif: recording {module} {args} failed ({rc})")
    pipeline, _ = load(str(path))
    return summarize(select(pipeline.analyses(), None))


def predicted_speedup(module: str, args: list[str], change: str, iterations: int, path: Path) -> tuple[float, dict[str, Any]]:
    s = recorded(module, args, "", iterations, path)
    row = next((w for w in s["what_if"] if w["change"] == change), None)
    if row is None:
        sys.exit(f"validate_whatif: the base run of {module} {args} gave no '{change}' what-if: {s['what_if']}")
    return float(row["speedup"]), s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--only", default="", help="run only the cases whose job or change contains this text")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dagtop-validate-"))
    chosen = [c for c in cases() if args.only in f"{c.job} {c.change}"]
    print(f"{'job':<24} {'change':<20} {'predicted':>9} {'measured':>9} {'spread':>13} {'error':>7}  "
          f"{'dagtop on':>8} {'error':>7}  fit k ± se")
    for n, case in enumerate(chosen):
        pred, meas, meas_on, fits = [], [], [], ""
        for r in range(args.rounds):
            p, s = predicted_speedup(case.module, case.base_args, case.change, args.iterations, tmp / f"{n}-{r}.dagtop")
            base = own_clock_ms(case.module, case.base_args, "", args.iterations, tmp / f"{n}-{r}-base.txt")
            real = own_clock_ms(case.module, case.rerun_args, case.patch, args.iterations, tmp / f"{n}-{r}-re.txt")
            on = recorded(case.module, case.rerun_args, case.patch, args.iterations, tmp / f"{n}-{r}-re.dagtop")
            pred.append(p)
            meas.append(base / real)
            meas_on.append(s["iteration_ms"]["median"] / on["iteration_ms"]["median"])
            fits = " ".join(f"{f['lane']} {f['factor']:.3f}±{f['stderr']:.3f}" for f in s.get("interference", []))
        p, m, m_on = statistics.median(pred), statistics.median(meas), statistics.median(meas_on)
        print(f"{case.job:<24} {case.change:<20} {p:>8.2f}× {m:>8.2f}× {min(meas):>5.2f}–{max(meas):<5.2f}× "
              f"{abs(p - m) / m * 100:>6.1f}%  {m_on:>7.2f}× {abs(p - m_on) / m_on * 100:>6.1f}%  {fits or 'none'}",
              flush=True)
    print(f"{'demo / transformer':<24} {'2N workers':<20} not run: 2 ranks already take the 2 cores; 4 would "
          "measure core sharing, not the network")


if __name__ == "__main__":
    main()
