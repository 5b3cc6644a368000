"""What dagtop does to a compiled model: the graphs Dynamo compiles and the step time, with and without dagtop.

    python benchmarks/bench_compile.py                               # inductor, 2 ranks, ~10 minutes on 2 cores
    python benchmarks/bench_compile.py --backend aot_eager --rounds 3  # a quick look

For each way of compiling (``DDP(torch.compile(m))``, ``torch.compile(DDP(m))``, ``layer.compile()`` per block),
each rank (gloo, one thread each) builds the same model twice, compiles both, and attaches dagtop to the second.
Each is compiled after ``torch._dynamo.reset()`` with Dynamo's counters cleared, so the counts are that model's:
graphs, graph breaks, frames compiled, and traces Dynamo gave up on. Then rounds of ``--steps`` steps alternate
between the two (plain, timed, plain, ...); the figures are rank 0's medians over rounds of the mean step time,
and the median over rounds of each round's timed/plain ratio (two runs seconds apart, so slow drift cancels)
with its interquartile range. Nothing listens on the endpoint: the publisher still encodes and sends every frame.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch._dynamo
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

import instrument

VOCAB, WIDTH, SEQ, BATCH, LAYERS = 256, 128, 64, 16, 4
ORDERS = ("ddp_compile", "compile_ddp", "blocks")


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _wrap(order: str, backend: str) -> nn.Module:
    torch.manual_seed(0)
    model = Transformer()
    if order == "ddp_compile":
        return DDP(torch.compile(model, backend=backend))
    if order == "compile_ddp":
        return torch.compile(DDP(model), backend=backend)  # type: ignore[return-value]
    for layer in model.layers:
        layer.compile(backend=backend)
    return DDP(model)


class Run:
    """One model, its optimizer and (for the timed one) its tracer."""

    def __init__(self, order: str, backend: str, timed: bool, endpoint: str) -> None:
        self.model = _wrap(order, backend)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.tracer: Any = instrument.attach(self.model, self.optimizer, endpoint=endpoint) if timed else None

    def steps(self, batches: list[torch.Tensor]) -> float:
        """Mean seconds per step over ``batches``."""
        start = time.perf_counter()
        for tokens in batches:
            logits = self.model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return (time.perf_counter() - start) / len(batches)


def _counts() -> dict[str, int]:
    return {"graphs": counters["stats"]["unique_graphs"], "breaks": sum(counters["graph_break"].values()),
            "frames": counters["frames"]["total"], "gave_up": sum(counters["unimplemented"].values())}


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DAGTOP_TELEMETRY="0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(args.steps)]
    for order in args.orders:
        runs, counts = {}, {}
        for kind in ("plain", "dagtop"):
            torch._dynamo.reset()
            counters.clear()
            runs[kind] = Run(order, args.backend, kind == "dagtop", f"tcp://127.0.0.1:{port + 1}")
            runs[kind].steps(batches[:2])  # compiles forward and backward
            counts[kind] = _counts()
        for run in runs.values():  # the reset dropped the plain model's code: compiled again (cached), untimed
            run.steps(batches[:2])
        times: dict[str, list[float]] = {"plain": [], "dagtop": []}
        for _ in range(args.rounds):
            for kind, run in runs.items():
                times[kind].append(run.steps(batches))
        runs["dagtop"].tracer.close()
        if rank == 0:
            ratios = sorted(t / p for p, t in zip(times["plain"], times["dagtop"]))
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
            print(f"{order:12s} plain {counts['plain']}  dagtop {counts['dagtop']}")
            print(f"{'':12s} step ms: plain {statistics.median(times['plain']) * 1e3:.1f}  dagtop "
                  f"{statistics.median(times['dagtop']) * 1e3:.1f}  paired {statistics.median(ratios) - 1:+.1%} "
                  f"(IQR {q[0] - 1:+.1%} .. {q[2] - 1:+.1%}, {args.rounds} rounds of {args.steps} steps)",
                  flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--orders", nargs="+", default=list(ORDERS), choices=ORDERS)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}, backend {args.backend}, 2 ranks (gloo), model {LAYERS} layers of width {WIDTH}, "
          f"batch {BATCH}x{SEQ}")
    mp.spawn(_rank, args=(args, port), nprocs=2)


if __name__ == "__main__":
    main()
