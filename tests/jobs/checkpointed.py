"""A residual MLP stack under DDP whose layers run through activation checkpointing: all of it compute.

``--checkpoint``: ``reentrant`` (``use_reentrant=True``: the layer's forward runs under no_grad and again inside
backward), ``nonreentrant`` (``use_reentrant=False``), or ``none``. ``--static-graph`` builds DDP with
``static_graph=True`` (then DDP rebuilds its buckets after iteration 1, not 0). ``--granularity`` is attach's.
"""

from __future__ import annotations

import argparse

import torch
from common import Losses, finish, save_losses, start
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import instrument

VOCAB, WIDTH, SEQ, BATCH = 64, 128, 32, 16


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, mode: str, layers: int = 3) -> None:
        super().__init__()
        self.mode = mode
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            if self.mode == "none":
                x = layer(x)
            else:
                x = checkpoint(layer, x, use_reentrant=self.mode == "reentrant")
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="reentrant", choices=["reentrant", "nonreentrant", "none"])
    parser.add_argument("--static-graph", action="store_true")
    parser.add_argument("--granularity", default="block", choices=["block", "layer"])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    rank, _ = start()
    model = DDP(Stack(args.checkpoint), static_graph=args.static_graph)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tracer = instrument.attach(model, optimizer, granularity=args.granularity)
    g = torch.Generator().manual_seed(1000 + rank)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(args.steps)]
    losses = Losses()
    for tokens in tracer.loader(data):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    tracer.close()
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
