"""What every framework job shares: the process group, the seed, and where the losses go.

A job is a script run once per rank by :func:`ranks.run_job` (tests/ranks.py), with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus ``JOB_OUT``, a folder for its results, and either
``DAGTOP_ENDPOINT`` (timed) or ``DAGTOP_DISABLE=1`` (the same job, plain). It writes each step's loss with
:func:`save_losses`, as ``float.hex`` so that "bit-identical" means what it says.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def start(seed: int = 0) -> tuple[int, int]:
    """Join the gloo process group; (rank, world). One thread per rank: two ranks share two cores.

    Under torchrun's default (static) rendezvous a restarted incarnation meets in the store of the one before
    (torch 2.13 keeps the agent's TCPStore across restarts and its workers add no prefix): gloo can then read a dead
    process's address and wait on it for good. Each incarnation here meets under a prefix of its own."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
        store = dist.PrefixStore(f"incarnation-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


class Losses(list):  # type: ignore[type-arg]
    """The losses, each noted with when it came (``perf_counter``): benchmarks/bench_frameworks.py times the
    steps from them, the same clock in a plain and a timed run."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, loss: float) -> None:
        self.times.append(time.perf_counter())
        super().append(loss)


def save_losses(losses: list[float], name: str = "loss") -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    out = Path(os.environ["JOB_OUT"])
    (out / f"{name}-{rank}.json").write_text(json.dumps([float(x).hex() for x in losses]))
    if isinstance(losses, Losses):
        (out / f"times-{rank}.json").write_text(json.dumps(losses.times))


def finish() -> None:
    """Leave together, then exit at once: torch 2.13's gloo can hang for good freeing its process group (its
    destructor holds the GIL while waiting for a worker thread that wants the GIL), a teardown that has
    nothing to do with the job or with dagtop. Everything the job writes is written before this."""
    if dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
