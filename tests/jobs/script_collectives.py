"""A DDP job that calls collectives by hand every step, as training scripts do: the loss all-reduced for logging,
an asynchronous all-reduce waited on later, an all-gather, a broadcast and a barrier. Saves the losses and the
values its own collectives returned (bit-identity with and without dagtop)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import finish, save_losses, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import instrument


def main() -> None:
    rank, world = start()
    model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer)
    g = torch.Generator().manual_seed(rank)
    data = tracer.loader((torch.randn(64, 64, generator=g), torch.randint(0, 8, (64,), generator=g)) for _ in range(12))
    losses: list[float] = []
    logged: list[float] = []
    for x, y in data:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        pending = dist.all_reduce(torch.ones(256) * rank, async_op=True)
        gathered = torch.empty(world * 4)
        dist.all_gather_into_tensor(gathered, mean.repeat(4))
        first = torch.full((3,), float(rank))
        dist.broadcast(first, src=0)
        pending.wait()
        dist.barrier()
        losses.append(loss.item())
        logged.append(float(mean / world) + float(gathered.sum()) + float(first.sum()))
    tracer.close()
    save_losses([*losses, *logged])  # what its own collectives returned must be bit-identical too
    finish()


if __name__ == "__main__":
    main()
