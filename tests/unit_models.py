"""What the unit tests share (tests/test_units.py, test_units_compiled.py): small models laid out as real ones are,
and reading what the shim sent."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from instrument import wire


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln(x))


class Transformer(nn.Module):
    """Laid out like HF's GPT-2: the layers in a ModuleList, which is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(50, 16)
        self.h = nn.ModuleList(Layer() for _ in range(3))
        self.ln_f = nn.LayerNorm(16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for layer in self.h:
            x = layer(x)
        return self.ln_f(x)


class LM(nn.Module):
    """A thin wrapper holding the transformer and a head tied to its embedding (``*ForCausalLM``)."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = Transformer()
        self.lm_head = nn.Linear(16, 50, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.transformer(ids))


def iterations(collector: Any) -> list[wire.IterationBatch]:
    frames = (wire.decode(r.payload) for r in collector.until_bye())
    return [f for f in frames if isinstance(f, wire.IterationBatch)]


def train(model: nn.Module, tracer: Any, optimizer: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(50, (4, 8), generator=g)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
