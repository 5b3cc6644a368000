"""CUDA timing: pooled events recorded by hooks, resolved to CPU-clock nanoseconds on the publisher thread.

Not exercised on this project's CPU machines; written from the torch 2.13 source (see FIELD_NOTES, "GPU
timing") and tested by the ``cuda``-marked tests on a GPU host.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any, Final

import torch

POOL_EVENTS: Final = 4096
"""Preallocated events: a few iterations' worth of a 1,000-event model, so hooks never allocate."""

CALIBRATION_POLL_NS: Final = 2_000_000
"""An anchor that takes longer than this to complete is discarded (the GPU front end was busy)."""


class CudaTiming:
    """Stamps (recorded CUDA events), the copy stream, and the GPU-to-CPU clock for one device."""

    def __init__(self, device: torch.device, pool_events: int = POOL_EVENTS) -> None:
        self.device = device
        with torch.cuda.device(device):
            self._free = collections.deque(torch.cuda.Event(enable_timing=True) for _ in range(pool_events))
            self.copy_stream = torch.cuda.Stream(device)
            self._anchor_stream = torch.cuda.Stream(device)
        self._anchor: torch.cuda.Event | None = None
        self._anchor_ns = 0

    def stamp(self) -> torch.cuda.Event:
        """Record an event on the current stream; any thread (deque pops are atomic)."""
        try:
            event = self._free.popleft()
        except IndexError:  # the publisher is behind: grow rather than lose the timing
            event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # ------------------------------------------------------------------ publisher thread

    def calibrate(self) -> None:
        """Pair a GPU timestamp with ``perf_counter_ns``: an event on an idle stream, busy-polled.

        elapsed_time is float32 milliseconds, so anchors are renewed about once a second to keep the
        conversion within a fraction of a microsecond.
        """
        with torch.cuda.device(self.device):
            anchor = torch.cuda.Event(enable_timing=True)
            anchor.record(self._anchor_stream)
            begin = time.perf_counter_ns()
            while not anchor.query():
                if time.perf_counter_ns() - begin > CALIBRATION_POLL_NS:
                    return
            self._anchor_ns = time.perf_counter_ns()
            self._anchor = anchor

    def ready(self, events: Sequence[tuple[Any, ...]]) -> bool:
        for ev in events:
            for stamp in (ev[4], ev[5]):
                if not isinstance(stamp, int) and not stamp.query():
                    return False
        return True

    def resolve(self, events: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Replace every event's CUDA stamps by CPU nanoseconds and give the events back to the pool."""
        if self._anchor is None:
            self.calibrate()
        out = []
        for ev in events:
            start, end = ev[4], ev[5]
            if not isinstance(start, int):
                start = self._to_ns(start)
            if not isinstance(end, int):
                end = self._to_ns(end)
            out.append((ev[0], ev[1], ev[2], ev[3], max(0, start), max(0, start, end), ev[6]))
        # One stamp may end a block's backward and start the next one's: give each event back once.
        used = {id(s): s for ev in events for s in (ev[4], ev[5]) if not isinstance(s, int)}
        self._free.extend(used.values())
        return out

    def _to_ns(self, event: torch.cuda.Event) -> int:
        if self._anchor is None:  # no calibration succeeded yet: the best we have is "now"
            return time.perf_counter_ns()
        return self._anchor_ns + round(self._anchor.elapsed_time(event) * 1e6)


def move_on_copy_stream(
    timing: CudaTiming, batch: Any, device: torch.device, move: Any
) -> tuple[Any, int, torch.cuda.Event, torch.cuda.Event]:
    """Copy ``batch`` to the GPU on the copy stream between two events; the compute stream waits for it.

    Copies from pageable memory are synchronous for the host anyway; from pinned memory they overlap.
    """
    current = torch.cuda.current_stream(device)
    stream = timing.copy_stream
    stream.wait_stream(current)  # the destination memory may still be in use by earlier compute
    with torch.cuda.stream(stream):
        start = timing.stamp()
        out, size = move(batch, device, True)
        end = timing.stamp()
    current.wait_stream(stream)
    _record_stream(out, current)
    return out, size, start, end


def _record_stream(value: Any, stream: torch.cuda.Stream) -> None:
    # Memory allocated on the copy stream and used on the compute stream must not be reused too early.
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _record_stream(item, stream)
    elif isinstance(value, dict):
        for item in value.values():
            _record_stream(item, stream)
