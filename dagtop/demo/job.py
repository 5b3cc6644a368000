"""One rank of the demo job: a small CNN trained with DDP on gloo, instrumented with the attach API.

Run by :class:`dagtop.demo.launch.DemoJob` as ``python -m dagtop.demo.job`` with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and DAGTOP_ENDPOINT in the environment. Each ``--bottleneck`` is real work,
not a fake timestamp: a slow dataset, heavier convolutions, a layer with tens of millions of parameters
to all-reduce, or large batches copied from pageable memory (CUDA only).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import signal
import sys
import threading
import time
from typing import Any

from dagtop.exits import Exit

BOTTLENECKS = ("none", "io", "compute", "allreduce", "pcie")
CLASSES = 10
IMAGE = 32
BATCH = 64
BUCKET_CAP_MB = 0.1
"""Small buckets: several all-reduces overlap the backward, as in a real model (DDP default 25 MB = one here)."""
IO_SLEEP_S = 0.002
"""Per-sample wait of the slow dataset: 64 samples, ~130 ms per batch, several times the compute."""
COMPUTE_REPEAT = 4
"""The heavy rank runs every convolution this many times over: same parameters, four times the work."""
WIDE_ROWS = 500_000
"""Rows of the wide embedding table: 500,000 x 64 = 32 M parameters, a 128 MB gradient for gloo to all-reduce."""
PCIE_BATCH = 256
PCIE_IMAGE = 192
"""The pcie rank copies one 113 MB batch (256 x 3 x 192 x 192 float32) from pageable memory every step, and
its model first pools the images down to 32 x 32: large inputs, a light model."""
ALLREDUCE_BATCH = 16
"""A small batch per rank, as when a job is spread over many GPUs: a quarter of the compute, the same bytes to sync."""
MONITOR_PID_ENV = "DAGTOP_DEMO_MONITOR_PID"
"""Set by ``dagtop demo`` (:mod:`dagtop.demo.launch`) to its own pid: the rank stops when that process is no longer
its parent (:func:`watch_monitor`). A rank run any other way (torchrun) watches nothing."""
MONITOR_POLL_S = 0.5
"""How often a rank looks whether its monitor is still its parent."""
ORPHAN_GRACE_S = 5.0
"""An orphaned rank stops at the next iteration boundary; if it has not exited this long after noticing (a
collective stuck on a peer that is already gone), it exits at once, with :attr:`~dagtop.exits.Exit.ORPHANED`."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dagtop.demo.job", description=__doc__.splitlines()[0])
    parser.add_argument("--bottleneck", choices=BOTTLENECKS, default="none")
    parser.add_argument("--straggler", type=int, default=None, metavar="RANK",
                        help="apply the bottleneck on this rank only (default: every rank)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations to run (default: until SIGTERM)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--granularity", choices=("block", "layer"), default="block")
    parser.add_argument("--sample-every", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def make_model(wide: bool) -> Any:
    """The demo CNN; imported lazily so that ``--help`` does not pay for torch."""
    import torch
    from torch import nn

    class ConvBlock(nn.Module):
        """conv-BN-ReLU; ``repeat`` > 1 runs the convolution that many times and averages (same result, more work)."""

        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.repeat = 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            for _ in range(self.repeat - 1):
                y = y + self.conv(x)
            out: torch.Tensor = self.relu(self.bn(y / self.repeat if self.repeat > 1 else y))
            return out

    class DemoNet(nn.Module):
        """Four conv blocks, global pooling, a classifier; optionally a wide embedding table."""

        def __init__(self, wide: bool) -> None:
            super().__init__()
            self.stem = ConvBlock(3, 16, 1)
            self.block1 = ConvBlock(16, 32, 2)
            self.block2 = ConvBlock(32, 64, 2)
            self.block3 = ConvBlock(64, 64, 1)
            self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.head = nn.Linear(64, CLASSES)
            # Like a recommender's embedding table: a forward reads a few rows, but the gradient is dense
            # (sparse=False, as DDP needs) and every one of its 32 M entries crosses the network each step.
            self.wide = nn.Embedding(WIDE_ROWS, 64) if wide else None
            self.input_pool = 1
            """Average-pool the input by this factor first (the pcie rank's large images)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.input_pool > 1:
                x = nn.functional.avg_pool2d(x, self.input_pool)
            z = self.pool(self.block3(self.block2(self.block1(self.stem(x)))))
            logits: torch.Tensor = self.head(z)
            if self.wide is not None:
                # One row per class, scored against the pooled features (detached: the table learns alone).
                rows = self.wide(torch.arange(CLASSES, device=z.device))
                logits = logits + 0.1 * (z.detach() @ rows.t())
            return logits

    return DemoNet(wide)


def make_dataset(size: int, sleep_s: float, image: int, seed: int) -> Any:
    import torch

    class SyntheticImages(torch.utils.data.Dataset):  # type: ignore[type-arg]
        """Images = class prototype + noise: learnable, so the loss goes down; ``sleep_s`` per sample is slow I/O."""

        def __init__(self) -> None:
            g = torch.Generator().manual_seed(seed)
            self.prototypes = torch.randn(CLASSES, 3, image, image, generator=g)

        def __len__(self) -> int:
            return size

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            if sleep_s:
                time.sleep(sleep_s)
            g = torch.Generator().manual_seed(seed * 1_000_003 + index)
            label = int(torch.randint(CLASSES, (1,), generator=g))
            return self.prototypes[label] + torch.randn(3, image, image, generator=g), label

    return SyntheticImages()


class Stop:
    """SIGTERM asks the loop to stop at the next iteration boundary, so a rank never dies mid-collective."""

    requested = False

    @classmethod
    def install(cls) -> None:
        def handler(signum: int, frame: Any) -> None:
            cls.requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def watch_monitor(monitor_pid: int, rank: int) -> threading.Thread:
    """Stop this rank when the ``dagtop demo`` that started it dies, however it dies.

    Each rank has its own session, so a closed terminal sends it no SIGHUP, and a SIGKILLed monitor runs no
    cleanup. What always happens is re-parenting: ``os.getppid()`` stops being the monitor's pid. A daemon
    thread polls for that (the pid comes from the launcher, so a monitor that died before this thread started
    is noticed too), asks the loop to stop like SIGTERM does, and hard-exits after ``ORPHAN_GRACE_S``.
    PR_SET_PDEATHSIG is not used: it fires when the parent *thread* that spawned us exits, and a monitor may
    start its ranks from a worker thread.
    """

    def watch() -> None:
        while os.getppid() == monitor_pid:
            time.sleep(MONITOR_POLL_S)
        print(f"demo: rank {rank}: its monitor (pid {monitor_pid}) is gone; stopping", file=sys.stderr, flush=True)
        Stop.requested = True
        time.sleep(ORPHAN_GRACE_S)
        print(f"demo: rank {rank}: still running {ORPHAN_GRACE_S:g} s later; exiting", file=sys.stderr, flush=True)
        os._exit(Exit.ORPHANED)

    thread = threading.Thread(target=watch, name="dagtop-monitor-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    slow = args.bottleneck != "none" and (args.straggler is None or args.straggler == rank)
    if args.bottleneck == "pcie" and not args.device.startswith("cuda"):
        print("demo: --bottleneck pcie needs --device cuda (a CPU job copies nothing over PCIe)", file=sys.stderr)
        return Exit.USAGE
    if args.bottleneck == "allreduce" and args.straggler is not None:
        print("demo: every rank all-reduces the same bytes; --straggler does not apply to allreduce",
              file=sys.stderr)
        return Exit.USAGE
    Stop.install()
    if os.environ.get(MONITOR_PID_ENV, "").isdigit():
        watch_monitor(int(os.environ[MONITOR_PID_ENV]), rank)

    import torch
    import torch.distributed as dist

    import instrument

    torch.set_num_threads(1)  # two ranks on a two-core machine
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    backend = "gloo"
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # NCCL wants a GPU per rank; ranks sharing a GPU all-reduce their CUDA tensors through gloo instead.
        if world <= torch.cuda.device_count():
            backend = "nccl"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))

    model = make_model(wide=args.bottleneck == "allreduce").to(device)
    if args.bottleneck == "compute" and slow:
        for m in model.modules():
            if hasattr(m, "repeat"):
                m.repeat = COMPUTE_REPEAT
    # No buffer broadcast: a straggler then shows where the spec expects it, in the bucket all-reduces.
    # Gradients written straight into the buckets: no 128 MB copy per iteration under --bottleneck allreduce.
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB, broadcast_buffers=False,
                                                    gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)  # no momentum: a lighter update for the wide layer
    batch = ALLREDUCE_BATCH if args.bottleneck == "allreduce" else BATCH
    dataset = make_dataset(1 << 30, IO_SLEEP_S if args.bottleneck == "io" and slow else 0.0, IMAGE,
                           args.seed + rank)
    loader: Any = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=0)
    if args.bottleneck == "pcie" and slow:
        model.input_pool = PCIE_IMAGE // IMAGE
        # Batches already in (pageable) host memory, as from a fast loader: all the time goes to the copy.
        images = torch.randn(PCIE_BATCH, 3, PCIE_IMAGE, PCIE_IMAGE)
        loader = itertools.repeat((images, torch.randint(CLASSES, (PCIE_BATCH,))))
    loss_fn = torch.nn.CrossEntropyLoss()

    tracer = instrument.attach(ddp, optimizer, granularity=args.granularity, sample_every=args.sample_every)
    step = 0
    try:
        for x, y in tracer.loader(loader):
            x, y = tracer.to_device((x, y), device)
            loss = loss_fn(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 20 == 0 and rank == 0:
                print(f"demo: step {step} loss {loss.item():.3f}", flush=True)
            if Stop.requested or (args.iterations is not None and step >= args.iterations):
                break
    except Exception as exc:
        if not Stop.requested:
            raise
        print(f"demo: rank {rank} stopped mid-iteration ({type(exc).__name__})", file=sys.stderr)
    finally:
        tracer.close()
    if not Stop.requested:
        dist.barrier()  # no rank tears gloo down while another still waits on it
    dist.destroy_process_group()
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
