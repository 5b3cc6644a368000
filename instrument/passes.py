"""What a step of a CPU rank spends passing over its gradients in ways gradient accumulation changes: DDP's copies
into its buckets and back, which ``no_sync`` skips, and autograd's adding a micro-batch's gradients to those
accumulated (:func:`gradient_passes`, timed once per bucket map by :class:`~instrument.comm.BucketTimer`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

COPY_SAMPLE_BYTES = 16 << 20
"""Bytes of parameters :func:`gradient_passes` times DDP's passes over, at most."""


def gradient_passes(ddp: Any, nbytes: int) -> tuple[int, int]:
    """(copies, adds), ns: what a step of a CPU rank spends in passes over its ``nbytes`` of gradients that
    gradient accumulation changes. *copies*: DDP's copy of each gradient into its bucket (multiplied by 1/world size
    on the way) and, once reduced, back into the gradient, two small ops per parameter on the training thread, which
    ``no_sync`` skips (none with ``gradient_as_bucket_view``: the gradients are the buckets). *adds*: autograd adding
    a micro-batch's gradient to those accumulated, one op per parameter, which every micro-batch after the first
    pays (a step after ``zero_grad`` takes its gradients as they come).

    Timed as the same ops on the model's parameters (read, never written) into scratch buffers, up to
    :data:`COPY_SAMPLE_BYTES` of them (the fastest of three; 9-41 ms of the training thread once per bucket map on
    the 2-core test machine, for 8 and 59 MB of gradients), scaled to ``nbytes``. (0, 0) on a GPU (kernels on the
    stream, microseconds) and where the timing fails (no memory for the scratch): an estimate, never worth the
    training."""
    if nbytes <= 0:
        return 0, 0
    try:
        params = [p.detach() for p in ddp.module.parameters() if p.requires_grad]
        if not params or params[0].device.type != "cpu":
            return 0, 0
        dtype, taken, total = params[0].dtype, [], 0
        for p in params:
            if p.dtype == dtype and total < COPY_SAMPLE_BYTES:
                taken.append(p)
                total += p.numel() * p.element_size()
        elements = sum(p.numel() for p in taken)
        bucket, back = torch.empty(elements, dtype=dtype), torch.zeros(elements, dtype=dtype)
        views: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # a parameter, its bucket view, its "grad"
        at = 0
        for p in taken:
            views.append((p, bucket[at:at + p.numel()].view_as(p), back[at:at + p.numel()].view_as(p)))
            at += p.numel()
        scale = 1.0 / max(dist.get_world_size(ddp.process_group), 1) if dist.is_initialized() else 1.0

        def copies() -> None:
            for p, view, _ in views:
                torch.mul(p, scale, out=view)
            for _, view, grad in views:
                grad.copy_(view)

        def adds() -> None:
            for p, _, grad in views:
                grad.add_(p)

        copy_ns = 0 if getattr(ddp, "gradient_as_bucket_view", False) else min(_timed(copies) for _ in range(3))
        add_ns = min(_timed(adds) for _ in range(3))
    except Exception:  # noqa: BLE001 - the shim never takes training down
        return 0, 0
    return copy_ns * nbytes // max(total, 1), add_ns * nbytes // max(total, 1)


def _timed(work: Callable[[], object]) -> int:
    start = time.perf_counter_ns()
    work()
    return time.perf_counter_ns() - start
