"""A small transformer language model trained with DDP on gloo, written plainly as a user would: a job dagtop's
what-ifs were not tuned on (benchmarks/validate_whatif.py validates them against its re-runs).

Run one rank per process with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and DAGTOP_ENDPOINT to be watched):
``python -m benchmarks.whatif_job --iterations 30 [--slow-rank 1]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

import instrument

VOCAB, WIDTH, LAYERS, HEADS, SEQ, BATCH = 4096, 192, 3, 4, 64, 8
SLOW_LOAD_S = 0.04
"""The slow rank's loader waits this long per batch: a rank on a slower disk."""


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(SEQ, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.embed(tokens) + self.pos))
        return out


def batches(seed: int, delay_s: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    while True:
        if delay_s:
            time.sleep(delay_s)
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
        yield tokens[:, :-1], tokens[:, 1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--slow-rank", type=int, default=None)
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    model = nn.parallel.DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracer = instrument.attach(model, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(rank, SLOW_LOAD_S if rank == args.slow_rank else 0.0)
    for step, (x, y) in enumerate(tracer.loader(data)):
        loss = loss_fn(model(x).reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step + 1 >= args.iterations:
            break
    tracer.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
