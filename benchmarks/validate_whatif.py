"""Check two what-ifs against real re-runs of the demo job: predicted (from a base run) vs measured (re-run).

* "all-reduce ×0.5": base = ``--bottleneck allreduce``; re-run all-reducing only the first half of every bucket
  (half the bytes on the wire, the same compute; halving the embedding table would also halve its backward
  and update).
* "perfect overlap": base = ``--bottleneck allreduce``; re-run with DDP's all-reduce replaced by a no-op hook
  (communication free: what the model's 'perfect overlap' replay assumes).

The demo job has no knob for either, so the re-runs start the same ``dagtop.demo.job`` module with one
constant or one function patched in the rank process (nothing in the repository changes).
Run: ``python benchmarks/validate_whatif.py [--iterations 25]`` (about two minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dagtop.demo.launch import DemoJob, free_endpoint, record_demo
from dagtop.model.summary import summarize
from dagtop.report import load, select

_HALF_BYTES = ("import torch.distributed as dist, instrument.comm as c\n"
               "def _half(state, bucket):\n"
               "    buf = bucket.buffer()\n"
               "    work = dist.all_reduce(buf[: buf.numel() // 2], group=state, async_op=True)\n"
               "    return work.get_future().then(lambda f: buf)\n"
               "c.allreduce_hook = _half")
_NO_COMM = ("import torch, instrument.comm as c\n"
            "def _free(state, bucket):\n"
            "    f = torch.futures.Future(); f.set_result(bucket.buffer()); return f\n"
            "c.allreduce_hook = _free")


class PatchedJob(DemoJob):
    """The demo job with a patch run in each rank before ``dagtop.demo.job.main``."""

    def __init__(self, patch: str, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.patch = patch

    def command(self) -> list[str]:
        cmd = super().command()
        code = f"{self.patch}\nimport sys, dagtop.demo.job as j\nsys.exit(j.main(sys.argv[1:]))"
        return [cmd[0], "-c", code, *cmd[3:]]


def measure(job: DemoJob, iterations: int, path: Path) -> dict:  # type: ignore[type-arg]
    rc = record_demo(job, path, iterations)
    if rc != 0:
        sys.exit(f"validate_whatif: demo run failed ({rc})")
    pipeline, _ = load(str(path))
    return summarize(select(pipeline.analyses(), None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=25)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dagtop-validate-"))
    base = measure(DemoJob(free_endpoint(), bottleneck="allreduce"), args.iterations, tmp / "base.dagtop")
    predicted = {w["change"]: w["iteration_ms"] for w in base["what_if"]}
    print(f"base run: measured {base['iteration_ms']['median']:.1f} ms, model {base['predicted_iteration_ms']:.1f} ms,"
          f" model error {base['model_error'] * 100:.2f} %")
    for change, patch in (("all-reduce ×0.5", _HALF_BYTES), ("perfect overlap", _NO_COMM)):
        job = PatchedJob(patch, endpoint=free_endpoint(), bottleneck="allreduce")
        rerun = measure(job, args.iterations, tmp / f"{change.split()[0]}.dagtop")
        real = rerun["iteration_ms"]["median"]
        err = abs(predicted[change] - real) / real
        print(f"{change:<18} predicted {predicted[change]:7.1f} ms   re-run measured {real:7.1f} ms   error {err * 100:5.1f} %")


if __name__ == "__main__":
    main()
