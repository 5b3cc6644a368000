"""Timing DDP's buffer broadcast before each forward: a collective on the training thread."""

from __future__ import annotations

from typing import Any

import torch

from instrument.events import SYNC_ON_MAIN
from instrument.probe import Probe

_compiling = torch.compiler.is_compiling


def time_buffer_sync(
    ddp: torch.nn.parallel.DistributedDataParallel,
    probe: Probe,
) -> bool:
    """Time DDP's buffer broadcast (``broadcast_buffers=True``, the default) before each forward.

    It is a collective on the training thread: a straggler's wait lands here first, outside every block,
    so leaving it untimed would hide it. Reported as ``SYNC_ON_MAIN`` "ddp.sync_buffers" on the probe's lane (the
tracer's ``main``, stamped with ``perf_counter_ns``).
    Relies on the private ``DistributedDataParallel._sync_buffers`` (torch 1.12 to 2.13); without it,
    nothing is timed and False is returned.
    """
    sync = getattr(ddp, "_sync_buffers", None)
    if sync is None or not getattr(ddp, "broadcast_buffers", False):
        return False
    size = sum(b.numel() * b.element_size() for b in ddp.module.buffers())
    if size == 0:
        return False
    switch, stamp, ended = probe.switch, probe.stamp, probe.ended

    def timed_sync_buffers(*args: Any, **kwargs: Any) -> Any:
        # Under torch.compile(DDP(m)) this runs inside the traced forward: a timestamp there is a graph break.
        if not switch.on or _compiling():
            return sync(*args, **kwargs)
        start = stamp()
        result = sync(*args, **kwargs)
        ended(SYNC_ON_MAIN, "ddp.sync_buffers", start, size)
        return result

    ddp._sync_buffers = timed_sync_buffers  # type: ignore[method-assign]
    return True
