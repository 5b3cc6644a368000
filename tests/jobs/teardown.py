"""A short DDP job that ends in one of the ways a real job ends, to check that dagtop's shim never turns an
exit into an abort (``terminate called without an active exception``). ``--order``:

- ``close``: ``tracer.close()``, then ``destroy_process_group()``, then the interpreter exits.
- ``destroy-first``: ``destroy_process_group()`` before ``tracer.close()``.
- ``no-close``: neither: the interpreter exits with the tracer open and the process group alive.
- ``no-close-destroy``: ``destroy_process_group()``, never ``close()``.
- ``raise``: an exception in the training loop, between ``backward()`` and ``step()``, on every rank (exit
  status 1).
- ``raise-in-backward``: an exception in a backward hook of the first block, on every rank: ``backward()``
  raises while the all-reduces of the other buckets are still in flight (exit status 1).
- ``raise-one``: rank 1 raises mid-iteration; the others fail in their next all-reduce (exit status 1).
- ``sigterm``: SIGTERM arrives during the backward pass, as torchrun's SIGTERM to the ranks may, and the job's
  own handler (``sys.exit``) raises out of it with the all-reduces in flight (exit status 143).
- ``exit-mid``: ``sys.exit(0)`` between ``backward()`` and ``step()``, an iteration left open.

It writes ``done-RANK`` in ``JOB_OUT`` once its work is over, so an abort after it shows as such.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import instrument

ORDERS = ("close", "destroy-first", "no-close", "no-close-destroy", "raise", "raise-in-backward", "raise-one",
          "sigterm", "exit-mid")
STEPS = 6
EXPECTED = {"close": {0}, "destroy-first": {0}, "no-close": {0}, "no-close-destroy": {0}, "raise": {1},
            "raise-in-backward": {1}, "raise-one": {1}, "sigterm": {143}, "exit-mid": {0}}
"""Each order's exit status for every rank (under torchrun: 0, or 1 for an order that fails)."""
FAIL_AT = 3
"""The step at which the orders that fail or exit early end the job."""


def done(rank: int) -> None:
    Path(os.environ["JOB_OUT"], f"done-{rank}").touch()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--order", choices=ORDERS, default="close")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.order == "sigterm":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    model = DDP(nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(6)),
                              nn.Linear(256, 10)), bucket_cap_mb=0.25)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer)
    data = [(torch.randn(32, 256), torch.randint(0, 10, (32,))) for _ in range(STEPS)]
    now = [0]

    def in_backward(grad: torch.Tensor) -> None:
        """The first block's gradient, the last computed: every other bucket's all-reduce is in flight."""
        done(rank)
        if args.order == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next Python line run, in backward
        else:
            raise RuntimeError(f"rank {rank}: a backward hook failed at step {now[0]}")

    def arm(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
        if now[0] == FAIL_AT and args.order in ("raise-in-backward", "sigterm") and output.requires_grad:
            output.register_hook(in_backward)

    model.module[0].register_forward_hook(arm)
    for step, (x, y) in enumerate(tracer.loader(data)):
        now[0] = step
        loss = nn.functional.cross_entropy(model(x), y)
        try:
            loss.backward()
        except RuntimeError:  # raise-one: the other rank is gone
            done(rank)
            raise
        if step == FAIL_AT:
            if args.order == "raise" or (args.order == "raise-one" and rank == 1):
                done(rank)
                raise RuntimeError(f"rank {rank}: the training loop failed at step {step}")
            if args.order == "exit-mid":
                done(rank)
                sys.exit(0)
        optimizer.step()
        optimizer.zero_grad()
    done(rank)
    if args.order == "close":
        tracer.close()
        dist.destroy_process_group()
    elif args.order == "destroy-first":
        dist.destroy_process_group()
        tracer.close()
    elif args.order == "no-close-destroy":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
