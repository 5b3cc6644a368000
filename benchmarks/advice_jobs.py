"""The jobs benchmarks/validate_advice.py records, advises and re-runs: written for it, not the demo.

One rank of a 2-rank gloo job (torchrun's environment). ``--job`` picks the kind:

* ``mlp``: a communication-heavy MLP (``--width``, ``--depth``, ``--batch``) fed from memory;
* ``loader``: a small MLP whose dataset waits ``--io-ms`` per sample (storage) through a DataLoader;
* ``hog``: the MLP, with rank 1 running a CPU hog it started itself, pinned to its own core (FIELD_NOTES: a hog
  started elsewhere is spread over both cores by the scheduler and slows both ranks);
* ``transformer``: a small transformer encoder on token batches.

Recording (``--arms`` one arm, ``DAGTOP_ENDPOINT`` set): the job attaches dagtop and trains ``--iterations``.
With ``--arms-file``, it then closes dagtop, waits for the file to name the arms (the advice on what it just
recorded) and re-runs them against the recorded model: the prediction and the truth minutes apart in one job.
Truth (``--arms A,B,…``, ``DAGTOP_DISABLE=1``): each arm is the job with one change made for real, and the arms
take turns every ``--block`` steps inside the one job, so the machine's load falls on all of them alike
(FIELD_NOTES: run-to-run noise here reaches 2×). Rank 0 writes each arm's step times (the job's own clock: one
``optimizer.step()`` return to the next, a block's first step left out) and samples per step to ``--out``.

An arm is ``name`` or ``name=value``: ``base``; ``cap=X`` (``bucket_cap_mb=X``), ``cap=default``,
``caps=a:b:c`` (``bucket_cap_mb_list``); ``workers=N`` (``num_workers=N, persistent_workers=True``);
``hook=bf16`` / ``hook=fp16`` (DDP's compress hooks), ``hook=noop`` (a hook that communicates nothing);
``nosync`` (every step under ``no_sync``: no all-reduce, no bucket copies); ``accumulate=K`` (``no_sync`` over K micro-batches, one
update per K); ``hog=off`` (the hog stopped with SIGSTOP for the arm's blocks); ``dagtop`` (the job with dagtop
attached: what the recording measured, beside the job the changes are compared with).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from instrument.probe import OwnTime
from instrument.steps import ThreadCpuCount
from instrument.wire import ThreadCpu

HOG = "import os\nos.nice(0)\nwhile True:\n    pass\n"
SMALL_LAYERS = ",".join(["64", "1024", "64", "512", "128", "256"] * 7)
"""``--widths`` of 41 small layers of three sizes (64 to 256 KiB of weights): with one bucket per layer, the
all-reduces' start-up cost holds the step."""


class Stored(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples made once and held in memory; with ``io_ms`` each read first waits that long (storage)."""

    def __init__(self, n: int, shape: tuple[int, ...], classes: int, io_ms: float = 0.0, tokens: int = 0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, tokens, (n, *shape), generator=g) if tokens else torch.randn(n, *shape, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.io_s = io_ms / 1e3

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.io_s:
            time.sleep(self.io_s)
        return self.x[i], self.y[i]


class Encoder(torch.nn.Module):
    """Token embedding, transformer encoder layers, a classifier on the mean token."""

    def __init__(self, vocab: int, d: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(d, 4, 4 * d, 0.0, batch_first=True)
                                          for _ in range(layers))
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(dim=1))


def model_of(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.job == "transformer":
        return Encoder(args.vocab, args.width, args.depth, 16)
    widths = [int(w) for w in args.widths.split(",")] if args.widths else [args.width] * (args.depth + 1)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 16))


def dataset_of(args: argparse.Namespace) -> Stored:
    n = args.batch * 64
    if args.job == "transformer":
        return Stored(n, (args.seq,), 16, tokens=args.vocab)
    first = int(args.widths.split(",")[0]) if args.widths else args.width
    return Stored(n, (first,), 16, io_ms=args.io_ms if args.job == "loader" else 0.0)


def loader_of(args: argparse.Namespace, workers: int) -> DataLoader[Any]:
    return DataLoader(dataset_of(args), batch_size=args.batch, shuffle=False, drop_last=True, num_workers=workers,
                      persistent_workers=workers > 0)


def forever(loader: DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


class Arm:
    """One change made for real: its model (a DDP copy), its batches and how it steps."""

    def __init__(self, spec: str, args: argparse.Namespace, world: int) -> None:
        self.spec = spec
        name, _, value = spec.partition("=")
        kw: dict[str, Any] = {}
        if args.bucket_cap is not None:
            kw["bucket_cap_mb"] = args.bucket_cap
        if name == "cap":
            kw.pop("bucket_cap_mb", None)
            if value != "default":
                kw["bucket_cap_mb"] = float(value)
        elif name == "caps":
            kw.pop("bucket_cap_mb", None)
            kw["bucket_cap_mb_list"] = [float(c) for c in value.split(":")]
        self.ddp = torch.nn.parallel.DistributedDataParallel(model_of(args), broadcast_buffers=False, **kw)
        if name == "hook" and value == "noop":
            self.ddp.register_comm_hook(None, _no_communication)
        elif name == "hook":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self.ddp.register_comm_hook(dist.group.WORLD, {"bf16": default_hooks.bf16_compress_hook,
                                                           "fp16": default_hooks.fp16_compress_hook}[value])
        self.nosync = name == "nosync"
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=1e-4)
        self.accumulate = int(value) if name == "accumulate" else 1
        self.loader = loader_of(args, int(value) if name == "workers" else args.workers)
        self.batches = forever(self.loader)
        self.hog_off = spec == "hog=off"
        self.shim_ms: list[float] = []
        """With dagtop: the shim's own time in its hooks in each step, as it sends it (CPU ranks)."""
        if name == "dagtop":  # the job as it was, with dagtop attached (its frames sent to whoever listens)
            import instrument

            tracer = instrument.attach(self.ddp, self.optimizer, granularity=args.granularity)
            self.batches = forever(tracer.loader(self.loader))  # type: ignore[arg-type]
            counted = getattr(tracer, "_cpu", None)  # a CPU rank's count of the training thread's time
            if counted is not None:
                tracer._cpu = _Kept(counted.own, self.shim_ms)  # type: ignore[union-attr]
        self.samples_per_step = args.batch * world * self.accumulate

    def step(self) -> None:
        for k in range(self.accumulate):
            x, y = next(self.batches)
            if k < self.accumulate - 1 or self.nosync:
                with self.ddp.no_sync():
                    torch.nn.functional.cross_entropy(self.ddp(x), y).backward()
            else:
                torch.nn.functional.cross_entropy(self.ddp(x), y).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class _Kept(ThreadCpuCount):
    """The shim's count of the training thread's time, keeping what it sends of its own."""

    def __init__(self, own: OwnTime, kept: list[float]) -> None:
        super().__init__(own)
        self.kept = kept

    def spent(self) -> ThreadCpu:
        spent = super().spent()
        self.kept.append(spent.shim_ns / 1e6)
        return spent


def _no_communication(state, bucket):  # type: ignore[no-untyped-def] # DDP refuses a string annotation
    """A comm hook that communicates nothing: the step with DDP's bucket copies but no all-reduce."""
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def start_hog(rank: int) -> subprocess.Popen[bytes] | None:
    """Rank 1's own CPU hog, on its core (inherits the rank's affinity and session)."""
    if rank != 1:
        return None
    return subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL)


PRIORITY_ENV = "ADVICE_AUTOGROUP_NICE"
"""When set (e.g. -10), each rank gives its own session's scheduler group that nice: the machine is shared with other
people's test runs, and with autogroup scheduling a session's share is its group's weight, whatever its processes'
own nice values. The rank, the hog it starts and its DataLoader workers share that group."""


def shield() -> None:
    nice = os.environ.get(PRIORITY_ENV)
    if nice:
        try:
            Path("/proc/self/autogroup").write_text(nice)
        except OSError as exc:
            print(f"advice_jobs: {PRIORITY_ENV}={nice} not applied: {exc}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=("mlp", "loader", "hog", "transformer"), required=True)
    parser.add_argument("--arms", default="base", help="comma-separated arms (see the module's docstring)")
    parser.add_argument("--iterations", type=int, default=40, help="with one arm: steps to train")
    parser.add_argument("--block", type=int, default=5, help="steps per block of an arm")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per arm")
    parser.add_argument("--out", default="", help="rank 0 writes the arms' step times here (JSON)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--widths", default="", help="MLP: the layers' widths, input first (instead of --width and "
                                                      "--depth): layers of several sizes, as real models have")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--io-ms", type=float, default=1.0, help="loader job: wait per sample")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers of the job as it is")
    parser.add_argument("--bucket-cap", type=float, default=None, help="bucket_cap_mb of the job as it is")
    parser.add_argument("--granularity", choices=("block", "layer"), default="block")
    parser.add_argument("--arms-file", default="", help="record --iterations with dagtop, then wait for this file "
                                                         "to name the arms to re-run (empty: none) and re-run them")
    args = parser.parse_args()

    shield()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.sched_setaffinity(0, {rank % os.cpu_count()})  # type: ignore[arg-type]
    hog = start_hog(rank) if args.job == "hog" else None
    try:
        arms = [Arm(spec, args, world) for spec in args.arms.split(",")]
        if args.arms_file:
            record(arms[0], args)
            arms += [Arm(spec, args, world) for spec in told(Path(args.arms_file), rank)]
            if len(arms) > 1:
                truth(arms, args, rank, hog)
        elif len(arms) == 1:
            record(arms[0], args)
        else:
            truth(arms, args, rank, hog)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # torch 2.13's gloo can hang freeing its process group (tests/jobs/common.py)


def record(arm: Arm, args: argparse.Namespace) -> None:
    """Train one arm with dagtop attached (``DAGTOP_DISABLE=1`` makes it a plain run)."""
    import instrument

    tracer = instrument.attach(arm.ddp, arm.optimizer, granularity=args.granularity)
    arm.batches = forever(tracer.loader(arm.loader))  # type: ignore[arg-type]
    for _ in range(args.iterations):
        arm.step()
    tracer.close()


def told(path: Path, rank: int) -> list[str]:
    """The arms named in ``path`` once it appears (the advice on what was just recorded): every rank reads it (one
    host), then they go on together."""
    deadline = time.monotonic() + 900
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    said = path.read_text().strip() if path.exists() else ""
    dist.barrier()
    return [a for a in said.split(",") if a]


def truth(arms: list[Arm], args: argparse.Namespace, rank: int, hog: subprocess.Popen[bytes] | None) -> None:
    """The arms in turn, ``--block`` steps each, ``--blocks`` times; rank 0 writes the step times."""
    times: dict[str, list[float]] = {a.spec: [] for a in arms}
    for arm in arms:  # warm-up: DDP rebuilds its buckets after the first step; workers start
        for _ in range(3):
            arm.step()
    pause: Callable[[bool], None] = (lambda off: hog.send_signal(signal.SIGSTOP if off else signal.SIGCONT)) \
        if hog is not None else (lambda off: None)
    for _ in range(args.blocks):
        for arm in arms:
            pause(arm.hog_off)
            last = time.perf_counter_ns()
            for s in range(args.block):
                arm.step()
                now = time.perf_counter_ns()
                if s:
                    times[arm.spec].append((now - last) / 1e6)
                last = now
    pause(False)
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({
            "arms": {a.spec: {"step_ms": times[a.spec], "samples_per_step": a.samples_per_step,
                              **({"shim_ms": a.shim_ms} if a.shim_ms else {})} for a in arms},
            "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
