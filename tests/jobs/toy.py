"""The small transformer the framework jobs train: an embedding, pre-norm layers held in a ModuleList (never called
itself, as in nanoGPT and Llama), an optional final norm, and a head over a vocabulary of :data:`VOCAB` tokens."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 64


class Layer(nn.Module):
    """Attention (unless ``attention=False``: an MLP block alone) and an MLP, each added to what came in."""

    def __init__(self, width: int, attention: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True) if attention else None
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attn is None:
            return x + self.mlp(self.norm(x))
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class Transformer(nn.Module):
    def __init__(self, layers: int, width: int, attention: bool = True, final_norm: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(Layer(width, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(width) if final_norm else None
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x if self.norm is None else self.norm(x))
