"""A DDP job written for benchmarks/verdict_accuracy.py: balanced, with a real straggler, or communication-heavy,
watched by dagtop for a while and then measured without it, inside the same processes.

Run one rank per process with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DAGTOP_ENDPOINT:
``python benchmarks/verdict_job.py --mode compute --slow-rank 1 --iterations 40 --out DIR``.

Modes:

- ``balanced``: an MLP, every rank alike (the noise is the machine's);
- ``io``: the slow rank's loader sleeps ``--io-ms`` per batch (a rank on a slower disk);
- ``compute``: the slow rank starts a CPU hog of its own (same session) and both are pinned to one core: the only
  way to slow one rank on this machine (FIELD_NOTES: a hog from another shell is spread over both cores);
- ``comm``: a 10 M-parameter MLP at batch 2: 40 MB of gradients per step, communication-heavy, balanced.

Phases. First ``--iterations`` steps with dagtop attached (what the benchmark judges), in which the job also times
each step's loader wait and busy time (below) with its own clock (``perf_counter``): the truth of the very steps
dagtop saw. Then dagtop is closed and the job measures the truth with its own clock, never dagtop's:

- **excess**: each rank's busy time per step by its own clock (loader, forward, backward up to its last gradient,
  optimizer step: not the wait for the others' all-reduce that follows the last gradient), in the synchronous
  steps with the slowness on (below), and in ``--nosync-steps`` steps under ``ddp.no_sync()`` (no collective at
  all; a barrier between steps so that the ranks share the machine as when training). The straggler's excess is
  its busy time minus the other ranks' median, step by step.
- **slow rank removed**: ``--blocks`` pairs of blocks of 5 synchronous steps, the slowness switched on and off from
  block to block (the hog stopped with SIGSTOP and continued with SIGCONT; the loader's sleep skipped): each rank's
  step time, the first step of each block dropped.

``--script`` adds a hand-written ``dist.all_reduce(loss)`` and ``dist.barrier()`` per step (the logging idiom), and
``--losses FILE`` writes rank 0's losses (bit-identity with and without dagtop). Each rank writes
``DIR/truth-<rank>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import instrument

BLOCK = 5
"""Steps per block of the on/off toggle (the first of each is dropped: the switch's own transient)."""
READY_THEN_SPIN = "import sys; sys.stdout.write('r'); sys.stdout.flush()\nwhile True: pass"
"""The hog: says it runs, then spins."""
SHAPES = {"mlp": (256, 1024, 4, 10, 96), "comm": (1024, 2048, 3, 1024, 2)}
"""Mode family → (inputs, width, hidden layers, outputs, batch)."""


def mlp(inputs: int, width: int, layers: int, outputs: int) -> nn.Module:
    body: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(layers - 1):
        body += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(width, outputs))


class Loader:
    """Batches from a seeded generator; ``delay_s`` of sleep per batch while ``slow`` is set."""

    def __init__(self, rank: int, inputs: int, outputs: int, batch: int, delay_s: float) -> None:
        self.g = torch.Generator().manual_seed(100 + rank)
        self.inputs, self.outputs, self.batch, self.delay_s = inputs, outputs, batch, delay_s
        self.slow = delay_s > 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            if self.slow:
                time.sleep(self.delay_s)
            x = torch.randn(self.batch, self.inputs, generator=self.g)
            yield x, torch.randint(0, self.outputs, (self.batch,), generator=self.g)


class Hog:
    """A busy loop started by this rank (its own session), pinned with the rank's training thread to one core;
    stop() and go() switch it off and on. Only the calling thread is pinned (Linux: affinity is per thread): the
    threads gloo started before keep both cores, as on a node where a hog takes a core from one rank's compute."""

    def __init__(self, cpu: int) -> None:
        os.sched_setaffinity(0, {cpu})
        # The job trains once the hog is spinning, not while an interpreter starts up: on this loaded machine that
        # took 1-2 s, and the first 13-24 steps of a run were balanced by the job's own clock while the benchmark
        # judged them as the straggler's.
        self.proc = subprocess.Popen([sys.executable, "-c", READY_THEN_SPIN], stdout=subprocess.PIPE)
        os.sched_setaffinity(self.proc.pid, {cpu})
        assert self.proc.stdout is not None
        self.proc.stdout.read(1)

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def go(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["balanced", "io", "compute", "comm"], default="balanced")
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--io-ms", type=float, default=40.0)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--nosync-steps", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=0)
    parser.add_argument("--script", action="store_true")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--no-comm", action="store_true", help="a comm hook that communicates nothing (the truth "
                        "for 'perfect overlap' when no all-reduce overlaps compute)")
    parser.add_argument("--losses", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    slow = args.mode in ("io", "compute") and rank == args.slow_rank
    hog = None
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
        inputs, width, layers, outputs, batch = SHAPES["comm" if args.mode == "comm" else "mlp"]
        model = nn.parallel.DistributedDataParallel(mlp(inputs, width, layers, outputs), bucket_cap_mb=args.bucket_mb)
        if args.no_comm:
            model.register_comm_hook(None, _no_comm)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        if slow and args.mode == "compute":  # after the process group: gloo's threads are not pinned with the hog
            hog = Hog(rank % (os.cpu_count() or 1))
        loss_fn = nn.CrossEntropyLoss()
        loader = Loader(rank, inputs, outputs, batch, args.io_ms / 1e3 if slow and args.mode == "io" else 0.0)
        truth = run(args, rank, model, optimizer, loss_fn, loader, hog)
        if args.out:
            Path(args.out, f"truth-{rank}.json").write_text(json.dumps(truth))
        dist.barrier()
        dist.destroy_process_group()
    finally:
        if hog is not None:
            hog.close()
    return 0


def _no_comm(state, bucket):  # type: ignore[no-untyped-def] # DDP checks the annotations it finds, as objects
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def run(args: argparse.Namespace, rank: int, model: Any, optimizer: Any, loss_fn: Any, loader: Loader,
        hog: Hog | None) -> dict[str, Any]:
    clock = time.perf_counter_ns
    grads: list[int] = []
    first = model.module[0]  # the first layer's gradients are the backward's last: then the wait for the others
    hooks = [p.register_post_accumulate_grad_hook(lambda _: grads.append(clock())) for p in first.parameters()]
    tracer = instrument.attach(model, optimizer)
    batches = iter(tracer.loader(loader))
    losses: list[float] = []
    seen_io: list[int] = []
    seen_busy: list[int] = []
    for _ in range(args.iterations):
        # The job's own clock in the very steps dagtop times: its loader wait and its busy time, as step() below.
        start = clock()
        x, y = next(batches)
        loaded = clock()
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        grads.clear()
        loss.backward()
        backward = clock()
        optimizer.step()
        end = clock()
        seen_io.append(loaded - start)
        seen_busy.append((loaded - start) + (max(grads, default=backward) - loaded) + (end - backward))
        if args.script:
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            dist.barrier()
        losses.append(float(loss.detach()))
    tracer.close()
    if args.losses and rank == 0:
        Path(args.losses).write_text("\n".join(repr(x) for x in losses))
    plain = iter(loader)

    def step(sync: bool) -> int:
        """One step; its busy ns by the job's own clock: loader, forward, backward up to the last gradient (not the
        wait for the other ranks' all-reduce after it), optimizer step."""
        start = clock()
        x, y = next(plain)
        loaded = clock()
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            grads.clear()
            forward = clock()
            loss.backward()
            backward = clock()
        optimizer.step()
        end = clock()
        return (loaded - start) + (max(grads, default=backward) - forward) + (end - backward) + (forward - loaded)

    nosync = []
    for _ in range(args.nosync_steps):
        nosync.append(step(sync=False))
        dist.barrier()
    dist.barrier()
    on: list[int] = []
    off: list[int] = []
    busy_on: list[int] = []
    last = clock()
    for block in range(2 * args.blocks):
        slowed = block % 2 == 0
        if hog is not None:
            (hog.go if slowed else hog.stop)()
        loader.slow = slowed and loader.delay_s > 0
        for i in range(BLOCK):
            busy = step(sync=True)
            now = clock()
            if i:
                (on if slowed else off).append(now - last)
                if slowed:
                    busy_on.append(busy)
            last = now
    for hook in hooks:
        hook.remove()
    if hog is not None:
        hog.go()
    return {"rank": rank, "busy_nosync_ns": nosync, "busy_on_ns": busy_on, "step_on_ns": on, "step_off_ns": off,
            "losses": losses, "seen_io_ns": seen_io, "seen_busy_ns": seen_busy}


if __name__ == "__main__":
    sys.exit(main())
