"""A small transformer sharded with FSDP, two ranks on gloo: what tests/test_fsdp.py runs with and without dagtop.

``--mode``:

- ``fsdp2``: ``fully_shard`` on each layer, then on the root (the usual FSDP2 recipe); one step per batch.
- ``accumulate``: the same, ``--micro`` micro-batches per step (each unit gathers and reduces once per micro-batch).
- ``fsdp1``: ``FullyShardedDataParallel`` around each layer and the root (dagtop times no collective there).

``--hsdp`` shards FSDP2 on a 2-D mesh (HSDP: replicas of 2 shards, so 1 replica on 2 ranks, 2 on 4): each unit
also all-reduces its reduced gradients across replicas. ``--prefetch`` issues the first layer's all-gather ahead
of each step, with ``unshard(async_op=True)`` (FSDP2). Each rank prints its steps' wall times at the end (for
benchmarks/bench_fsdp.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
from common import Losses, finish, save_losses, start
from torch import nn
from toy import VOCAB, Transformer

import instrument

WIDTH, SEQ, BATCH = 32, 16, 8


def shard(model: Transformer, mode: str, hsdp: bool) -> nn.Module:
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for i, layer in enumerate(model.layers):
            model.layers[i] = FSDP(layer, device_id=torch.device("cpu"))
        return FSDP(model, device_id=torch.device("cpu"))
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if hsdp:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("replicate", "shard"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="fsdp2", choices=["fsdp2", "accumulate", "fsdp1"])
    parser.add_argument("--hsdp", action="store_true")
    parser.add_argument("--prefetch", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--width", type=int, default=WIDTH)
    args = parser.parse_args()
    rank, _ = start()
    model = shard(Transformer(args.layers, args.width, final_norm=True), args.mode, args.hsdp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tracer = instrument.attach(model, optimizer)
    micro = args.micro if args.mode == "accumulate" else 1
    g = torch.Generator().manual_seed(1000 + rank)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(args.steps * micro)]
    it = iter(tracer.loader(data))
    losses = Losses()
    times: list[float] = []
    for _ in range(args.steps):
        begin = time.perf_counter()
        if args.prefetch:
            model.layers[0].unshard(async_op=True)  # type: ignore[operator]
        for _ in range(micro):
            tokens = next(it)
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) / micro
            loss.backward()
            losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - begin)
    tracer.close()
    save_losses(losses)
    sys.stdout.write(f"step seconds of rank {rank}: {json.dumps(times)}\n")  # for benchmarks/bench_fsdp.py
    sys.stdout.flush()  # one write: the ranks share the log
    finish()


if __name__ == "__main__":
    main()
