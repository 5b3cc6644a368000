"""A small residual transformer under DDP and torch.compile, in the order given by ``--order``:

- ``ddp_compile``: ``DDP(torch.compile(model))``;
- ``compile_ddp``: ``torch.compile(DDP(model))``;
- ``blocks``: ``layer.compile()`` for each layer of the ModuleList, the model wrapped in DDP uncompiled.

Besides the losses it writes ``dynamo-<rank>.json`` into ``--counts`` (default ``$JOB_OUT``): what Dynamo counted
over the run (graphs compiled, graph breaks, frames it gave up on, its warnings), so that a test can tell whether
dagtop's hooks changed the compiled program.
``--backend`` defaults to ``aot_eager`` (Dynamo and AOTAutograd as inductor sees them, without its C++ compile,
which takes minutes on a 2-core runner).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import torch
import torch._dynamo
from common import Losses, finish, save_losses, start
from torch import nn
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP
from toy import VOCAB, Transformer

import instrument

WIDTH, SEQ, BATCH = 64, 32, 16


def wrap(model: Transformer, order: str, backend: str) -> nn.Module:
    if order == "ddp_compile":
        return DDP(torch.compile(model, backend=backend))
    if order == "compile_ddp":
        return torch.compile(DDP(model), backend=backend)  # type: ignore[return-value]
    for layer in model.layers:
        layer.compile(backend=backend)
    return DDP(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--order", default="ddp_compile", choices=["ddp_compile", "compile_ddp", "blocks"])
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--counts", default=os.environ.get("JOB_OUT", "."))
    args = parser.parse_args()
    rank, _ = start()
    model = wrap(Transformer(2, WIDTH, attention=False), args.order, args.backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tracer = instrument.attach(model, optimizer)
    g = torch.Generator().manual_seed(1000 + rank)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(args.steps)]
    losses = Losses()
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tokens in tracer.loader(data):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    tracer.close()
    dynamo = {
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "frames": counters["frames"]["total"],
        "frames_ok": counters["frames"]["ok"],
        "unimplemented": sum(counters["unimplemented"].values()),
        "dynamo_warnings": [str(w.message)[:200] for w in caught if "Dynamo" in str(w.message)],
    }
    (Path(args.counts) / f"dynamo-{rank}.json").write_text(json.dumps(dynamo))
    save_losses(losses)
    finish()


if __name__ == "__main__":
    main()
