"""All-reduce timing of every DDP gradient bucket, through a comm hook that wraps the default all-reduce."""

# No `from __future__ import annotations` here: DDP inspects the hook's annotations and wants real types.

import time
from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import GradBucket  # torch.distributed.GradBucket, where its type stubs export it
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from instrument import wire
from instrument.timing import Stamp, Switch

_compiling = torch.compiler.is_compiling


class BucketTimer:
    """Wraps DDP's default all-reduce to time each bucket from ready (hook called) to done (future complete).

    On gloo with CPU tensors the future completes when the all-reduce is over on this rank, so the CPU clock
    is right; the span includes waiting for the slowest rank, which is intended (the monitor starts the
    collective at the latest ready across ranks). On CUDA, ``comm_stamp`` records events instead: ready in
    the hook, on the compute stream (the bucket's gradients are computed there), done in the ``then``
    callback, which torch runs on a stream made to wait for the collective (an NCCL future completes at
    enqueue, so the host clock would say nothing).

    Why events rather than ``TORCH_NCCL_ENABLE_TIMING`` and ``work._get_duration()``: that needs the variable
    set before the process group starts (it times every collective of the job), needs the Work object,
    which the hook API does not hand back, and gives the kernel's duration only, not when the bucket was
    ready nor where the collective sits on the GPU clock. Measured on an H100 (benchmarks/gpu_truth.py
    --part 2), done is meant to be the later of the collective's end on the GPU and the moment the host ran
    the callback; relative to the end of each iteration, it differs from the end of the collective's GPU
    work by a median of 136 µs (max 367 µs) for NCCL at world size 1, which launches no kernel at all, and
    by 148 µs (max 1.0 ms) for gloo on CUDA tensors, whose all-reduces took 2 to 21 ms.
    """

    def __init__(
        self,
        ddp: "torch.nn.parallel.DistributedDataParallel",
        sink: Callable[[tuple[Any, ...]], None],
        stamp: Stamp,
        switch: Switch,
        fail: Callable[[BaseException], None],
    ) -> None:
        self._sink = sink
        self._stamp = stamp
        self._switch = switch
        self._fail = fail
        # Named as in the model: DDP(torch.compile(m)) holds m as `_orig_mod`.
        self._names = {id(p): n.replace("_orig_mod.", "") for n, p in ddp.module.named_parameters()}
        self._sizes: dict[int, int] = {}
        """Bucket index -> bytes, as the current iteration's hooks saw them: what tells that DDP rebuilt them."""
        self._sent: dict[int, int] = {}
        """The sizes of the bucket map :meth:`iteration_done` last returned."""
        self._capture = False
        """While True (the iteration after the buckets were seen to change), the hook notes their parameters."""
        self._captured: dict[int, wire.Bucket] = {}
        # Raises if a comm hook is already registered or training has begun; attach() handles that.
        ddp.register_comm_hook(ddp.process_group, self._hook)

    def _hook(self, state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        if not self._switch.on:
            return allreduce_hook(state, bucket)
        try:
            ready = self._stamp()
            index = bucket.index()
            buffer = bucket.buffer()
            size = buffer.numel() * buffer.element_size()
            self._sizes[index] = size
            if self._capture:
                names = tuple(self._names.get(id(p), "?") for p in bucket.parameters())
                self._captured[index] = wire.Bucket(index, size, names)
        except Exception as exc:  # noqa: BLE001 - never reach the training loop
            self._fail(exc)
            return allreduce_hook(state, bucket)
        name = f"bucket {index}"
        sink, stamp = self._sink, self._stamp

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            try:
                sink(("allreduce", "allreduce", name, "comm", ready, stamp(), size))
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
            return fut.value()  # a failed collective raises here, as it would without dagtop

        return allreduce_hook(state, bucket).then(done)

    def iteration_done(self) -> "list[wire.Bucket] | None":
        """Call once an iteration's buckets have all been handed over: the bucket map if it is new, else None.

        DDP rebuilds its buckets after iteration 0, after iteration 1 with ``static_graph=True``, and may again
        later. Each iteration the hook notes every bucket's size (one dict store); when they differ from the
        map last returned, the parameters of every bucket are noted during the next iteration, and that map is
        returned if the sizes did not change meanwhile. So the map follows the real buckets, one iteration
        late, and costs a walk over each bucket's parameters only in the iteration after a change.
        """
        sizes, self._sizes = self._sizes, {}
        if not sizes:  # no bucket this time (a job that never syncs, a failed hook): nothing learnt
            return None
        captured, self._captured = self._captured, {}
        if self._capture and {i: b.bytes for i, b in captured.items()} == sizes:
            self._capture, self._sent = False, sizes
            return [captured[i] for i in sorted(captured)]
        self._capture = sizes != self._sent
        return None


def time_buffer_sync(
    ddp: "torch.nn.parallel.DistributedDataParallel",
    sink: Callable[[tuple[Any, ...]], None],
    switch: Switch,
    fail: Callable[[BaseException], None],
) -> bool:
    """Time DDP's buffer broadcast (``broadcast_buffers=True``, the default) before each forward.

    It is a collective on the training thread: a straggler's wait lands here first, outside every block,
    so leaving it untimed would hide it. Reported as ("allreduce", "custom", "ddp.sync_buffers", "main").
    Relies on the private ``DistributedDataParallel._sync_buffers`` (torch 1.12 to 2.13); without it,
    nothing is timed and False is returned.
    """
    sync = getattr(ddp, "_sync_buffers", None)
    if sync is None or not getattr(ddp, "broadcast_buffers", False):
        return False
    size = sum(b.numel() * b.element_size() for b in ddp.module.buffers())
    if size == 0:
        return False
    now = time.perf_counter_ns

    def timed_sync_buffers(*args: Any, **kwargs: Any) -> Any:
        # Under torch.compile(DDP(m)) this runs inside the traced forward: a timestamp there is a graph break.
        if not switch.on or _compiling():
            return sync(*args, **kwargs)
        start = now()
        result = sync(*args, **kwargs)
        try:
            sink(("allreduce", "custom", "ddp.sync_buffers", "main", start, now(), size))
        except Exception as exc:  # noqa: BLE001
            fail(exc)
        return result

    ddp._sync_buffers = timed_sync_buffers  # type: ignore[method-assign]
    return True
