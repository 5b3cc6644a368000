"""Training loops with unusual iteration boundaries, on a small transformer whose layers sit in a ModuleList,
under DDP. ``--mode``:

- ``plain``: one forward, backward and ``step()`` per iteration.
- ``accumulate``: ``--micro`` micro-batches per step, all but the last under ``no_sync``.
- ``skip``: the GradScaler pattern: ``step()`` is skipped on some iterations (here every third), so only the
  next forward tells that an iteration ended.
- ``closure``: ``optimizer.step(closure)``, the closure running forward and backward (LBFGS-style, Lightning).
- ``two_optimizers``: the body and the head each with an optimizer, attached as a list.
"""

from __future__ import annotations

import argparse

import torch
from common import Losses, finish, save_losses, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from toy import VOCAB, Transformer

import instrument

WIDTH, SEQ, BATCH = 32, 16, 8


def batches(rank: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(n)]


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="plain",
                        choices=["plain", "accumulate", "skip", "closure", "two_optimizers"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro", type=int, default=3)
    args = parser.parse_args()
    rank, _ = start()
    model = DDP(Transformer(4, WIDTH))
    losses = Losses()
    micro = args.micro if args.mode == "accumulate" else 1
    data = batches(rank, args.steps * micro)
    if args.mode == "two_optimizers":
        body = [p for n, p in model.module.named_parameters() if not n.startswith("head")]
        optimizers = [torch.optim.SGD(body, lr=0.05), torch.optim.Adam(model.module.head.parameters(), lr=1e-3)]
        tracer = instrument.attach(model, optimizers)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        tracer = instrument.attach(model, optimizer)
    loader = tracer.loader(data)
    it = iter(loader)
    for step in range(args.steps):
        if args.mode == "accumulate":
            for m in range(micro):
                tokens = next(it)
                if m < micro - 1:
                    with model.no_sync():
                        loss = loss_of(model, tokens) / micro
                        loss.backward()
                else:
                    loss = loss_of(model, tokens) / micro
                    loss.backward()
                losses.append(loss.item())
            optimizer.step()
            optimizer.zero_grad()
        elif args.mode == "closure":
            tokens = next(it)

            def closure(tokens: torch.Tensor = tokens) -> torch.Tensor:
                optimizer.zero_grad()
                loss = loss_of(model, tokens)
                loss.backward()
                return loss

            losses.append(optimizer.step(closure).item())
        else:
            tokens = next(it)
            loss = loss_of(model, tokens)
            loss.backward()
            losses.append(loss.item())
            if args.mode == "two_optimizers":
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad()
            elif args.mode == "skip" and step % 3 == 1:
                optimizer.zero_grad()  # an overflow: GradScaler.step() does not call optimizer.step()
            else:
                optimizer.step()
                optimizer.zero_grad()
    tracer.close()
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
