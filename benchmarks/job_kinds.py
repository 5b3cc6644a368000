"""Four kinds of training job, written outside dagtop's demo: what the shim's cost is measured on
(benchmarks/bench_overhead.py) and what must train bit-identically with and without it (tests/jobs/kinds.py).

* ``cnn``, compute-heavy: the demo's CNN at its batch of 64, small gradients;
* ``mlp``, communication-heavy: a 2.6 M-parameter MLP at batch 32 (10 MB of gradients in two buckets, ~25 ms
  steps on two ranks of a 2-core VM), the job of issue #29;
* ``loader``, loader-bound: a small CNN fed by a ``DataLoader`` with two worker processes whose samples cost
  CPU to make (a blurred image each), more than the model's step;
* ``transformer``: a 4-layer GPT-style model with dropout whose blocks sit in a ``ModuleList``, 64 tokens × 4
  sequences;
* ``layers``, many small units and buckets: 41 small layers (64 to 1024 wide, 83 modules) with a gradient bucket
  each (``bucket_cap_mb=0.02``), batch 32: where a cost per unit or per bucket adds up. Its steps take 28-39 ms
  where a rank is pinned to its core after ``init_process_group`` (gloo's threads free to use the other core, as in
  benchmarks/advice_jobs.py), 84-96 ms where pinned before (gloo's threads on the rank's core too, as in
  bench_overhead.py): each of its 41 small all-reduces waits for a gloo thread to get the core.

Every batch is a function of the rank, the step and a seed, and the random draws during training (dropout, the
loader's augmentation) come from generators torch seeds from ``seed``, so two runs of a kind train the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

KINDS = ("cnn", "mlp", "loader", "transformer", "layers")
LOADER_WORKERS = 2


@dataclass
class Job:
    """One kind of job, ready for a rank: its model and how to get ``steps`` batches of (input, target)."""

    model: nn.Module
    batches: Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    """``steps`` → the batches of one run: a list, or for ``loader`` a fresh ``DataLoader`` with workers."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ddp: dict[str, Any] = field(default_factory=dict)
    """Its ``DistributedDataParallel`` arguments beyond the model."""


class _BlurredImages(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Images that cost a worker CPU to make: noise, blurred four times, then flipped at random as augmentation
    does, from the worker's own generator (which the DataLoader seeds from the training process's)."""

    def __init__(self, rank: int, length: int) -> None:
        self.rank, self.length = rank, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100_003 * self.rank + index)
        image = torch.randn(1, 3, 96, 96, generator=g)
        for _ in range(4):
            image = F.avg_pool2d(F.pad(image, (1, 1, 1, 1), mode="reflect"), 3, stride=1)
        image = image[0, :, ::2, ::2]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image.contiguous(), torch.randint(10, (), generator=g)


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=True, attn_mask=_causal(x.shape[1]))[0]
        return x + self.mlp(self.norm2(x))


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).triu(1)


class _GPT(nn.Module):
    VOCAB, WIDTH, SEQ = 256, 128, 64

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, self.WIDTH)
        self.position = nn.Parameter(torch.zeros(self.SEQ, self.WIDTH))
        self.layers = nn.ModuleList(_Block(self.WIDTH) for _ in range(layers))
        self.norm = nn.LayerNorm(self.WIDTH)
        self.head = nn.Linear(self.WIDTH, self.VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).flatten(0, 1)


def make(kind: str, rank: int, seed: int = 0) -> Job:
    """The job of ``kind`` for ``rank``; its parameters start from ``seed`` on every rank (DDP checks)."""
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(1000 + rank)
    cross_entropy = nn.CrossEntropyLoss()
    if kind == "cnn":
        from dagtop.demo.job import BATCH, IMAGE, make_model

        model: nn.Module = make_model(wide=False)
        return Job(model, lambda steps: [(torch.randn(BATCH, 3, IMAGE, IMAGE, generator=data),
                                          torch.randint(10, (BATCH,), generator=data)) for _ in range(steps)],
                   cross_entropy)
    if kind == "mlp":
        width = 1024
        model = nn.Sequential(nn.Linear(512, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                              nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
        return Job(model, lambda steps: [(torch.randn(32, 512, generator=data),
                                          torch.randint(10, (32,), generator=data)) for _ in range(steps)],
                   cross_entropy)
    if kind == "loader":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

        def loader(steps: int) -> Iterable[Any]:
            return torch.utils.data.DataLoader(_BlurredImages(rank, 16 * steps), batch_size=16,
                                               num_workers=LOADER_WORKERS)

        return Job(model, loader, cross_entropy)
    if kind == "transformer":
        model = _GPT()

        def tokens(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            out = []
            for _ in range(steps):
                t = torch.randint(_GPT.VOCAB, (4, _GPT.SEQ + 1), generator=data)
                out.append((t[:, :-1], t[:, 1:].flatten()))
            return out

        return Job(model, tokens, cross_entropy)
    if kind == "layers":
        widths = [64, 1024, 64, 512, 128, 256] * 7
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(widths[-1], 10))
        return Job(model, lambda steps: [(torch.randn(32, 64, generator=data),
                                          torch.randint(10, (32,), generator=data)) for _ in range(steps)],
                   cross_entropy, {"bucket_cap_mb": 0.02})
    raise ValueError(f"unknown job kind {kind!r}; one of {', '.join(KINDS)}")
