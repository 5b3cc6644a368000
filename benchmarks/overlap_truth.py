"""'perfect overlap' on one big bucket, against the truth measured inside one job: steps of the model with its
all-reduce, and steps of an identical copy whose comm hook communicates nothing, in alternating blocks of 5.

One rank process per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DAGTOP_ENDPOINT); the 10 M-parameter MLP at
batch 2 of benchmarks/verdict_job.py (40 MB of gradients), one bucket (``bucket_cap_mb=100``). dagtop is attached to
the model that communicates; its copy's steps are untimed (no hook of dagtop's on it): the first iteration dagtop
sees after each block of the copy spans that block, and is left out with the first of each block. Each rank writes
``OUT`` (rank 0; ``OUT-<rank>`` for the others; JSON): its step times, the model's and the copy's (the first of each
block dropped), dagtop's iteration number of each of the model's, each step's phases by the job's own clock (forward,
last gradient, backward's return, optimizer step), and which dagtop iterations follow a block of the copy.

    python benchmarks/overlap_truth.py --pairs 8 --out truth.json   (per rank; benchmarks/verdict_accuracy.py
    --overlap runs it and reads the recording)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import instrument
from benchmarks.verdict_job import SHAPES, _no_comm, mlp

BLOCK = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--bucket-mb", type=float, default=100.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--untimed", action="store_true", help="dagtop attached to neither model: the same job's "
                        "truth without dagtop's own cost")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    inputs, width, layers, outputs, batch = SHAPES["comm"]
    module = mlp(inputs, width, layers, outputs)
    talking = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=args.bucket_mb)
    silent = nn.parallel.DistributedDataParallel(copy.deepcopy(module), bucket_cap_mb=args.bucket_mb)
    silent.register_comm_hook(None, _no_comm)
    opt_talking = torch.optim.SGD(talking.parameters(), lr=1e-4)
    opt_silent = torch.optim.SGD(silent.parameters(), lr=1e-4)
    tracer = None if args.untimed else instrument.attach(talking, opt_talking)
    g = torch.Generator().manual_seed(rank)
    loss_fn = nn.CrossEntropyLoss()
    times: dict[str, list[int]] = {"talking": [], "silent": []}
    # Each step's phases by the job's own clock (ns from the step's start): forward and loss, the last gradient
    # (the backward's compute done: then the all-reduce of the one bucket), backward returned, optimizer step done.
    phases: dict[str, list[list[int]]] = {"talking": [], "silent": []}
    grads: list[int] = []
    for m in (talking, silent):
        for p in m.module[0].parameters():
            p.register_post_accumulate_grad_hook(lambda _: grads.append(time.perf_counter_ns()))
    talked: list[int] = []
    """dagtop's iteration number of each kept step of the model that communicates (``times["talking"]``)."""
    after_silent: list[int] = []
    iteration = 0
    last = time.perf_counter_ns()
    for block in range(2 * args.pairs + 1):
        which = "talking" if block % 2 == 0 else "silent"
        model, opt = (talking, opt_talking) if which == "talking" else (silent, opt_silent)
        for i in range(BLOCK):
            x = torch.randn(batch, inputs, generator=g)
            y = torch.randint(0, outputs, (batch,), generator=g)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            grads.clear()
            forward = time.perf_counter_ns()
            loss.backward()
            backward = time.perf_counter_ns()
            opt.step()
            now = time.perf_counter_ns()
            if i:
                times[which].append(now - last)
                phases[which].append([forward - last, max(grads, default=backward) - last, backward - last, now - last])
                if which == "talking":
                    talked.append(iteration)
            last = now
            if which == "talking":
                if i == 0 and block:
                    after_silent.append(iteration)
                iteration += 1
    if tracer is not None:
        tracer.close()
    out = Path(args.out)
    if rank:
        out = out.with_name(f"{out.stem}-{rank}{out.suffix}")
    out.write_text(json.dumps({"times": times, "phases": phases, "talked": talked, "after_silent": after_silent,
                                    "block": BLOCK}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
