"""CUDA timing: pooled events recorded by hooks, resolved to CPU-clock nanoseconds on the publisher thread.

Not exercised on this project's CPU machines; written from the torch 2.13 source (see FIELD_NOTES, "GPU
timing") and tested by the ``cuda``-marked tests on a GPU host.
"""

from __future__ import annotations

import collections
import ctypes
import time
from collections.abc import Sequence
from typing import Any, Final

import torch

from instrument.batch import map_tensors
from instrument.events import RawEvent

POOL_EVENTS: Final = 4096
"""Preallocated events: a few iterations' worth of a 1,000-event model, so hooks never allocate."""

# The bindings behind torch.cuda.is_current_stream_capturing, current_stream and Event.record, called
# directly: a stamp runs up to a few hundred times per iteration on the training and autograd threads.
_capturing = torch._C._cuda_isCurrentStreamCapturing
_current_stream = torch._C._cuda_getCurrentStream
_record = torch._C._CudaEventBase.record

STREAMS_CACHED: Final = 64
"""Stream objects kept per device, keyed by (id, device, type): building one per stamp costs more than the record."""

CU_STREAM_CAPTURE_MODE_RELAXED: Final = 2
"""cuda.h's CUstreamCaptureMode: this thread's CUDA calls no longer count against another thread's capture."""

CALIBRATION_WAIT_NS: Final = 200_000
"""An anchor that takes longer than this to complete is discarded (the GPU front end was busy)."""


class CudaTiming:
    """Stamps (recorded CUDA events) and the GPU-to-CPU clock for one device."""

    def __init__(self, device: torch.device, pool_events: int = POOL_EVENTS) -> None:
        self.device = device
        with torch.cuda.device(device):
            self._free = collections.deque(torch.cuda.Event(enable_timing=True) for _ in range(pool_events))
            self._anchor_stream = torch.cuda.Stream(device)
        self._anchor: torch.cuda.Event | None = None
        self._anchor_ns = 0
        self._index = torch.device(device).index or 0
        self._streams: dict[tuple[int, int, int], torch.cuda.Stream] = {}
        self._waiting: tuple[Sequence[RawEvent] | None, int] = (None, 0)
        """The iteration ready() last found incomplete, and how many of its events it found complete."""

    def stamp(self) -> torch.cuda.Event | None:
        """Record an event on the current stream; any thread (deque pops are atomic).

        None while the stream is being captured into a CUDA graph: recording a timing event there would
        invalidate the user's capture, and the graph's replays run no hooks anyway. Events holding a None
        stamp are dropped when the iteration is resolved.
        """
        if _capturing():
            return None
        key = _current_stream(self._index)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= STREAMS_CACHED:
                self._streams.clear()
            stream = self._streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                            device_type=key[2])
        try:
            event = self._free.popleft()
        except IndexError:  # the publisher is behind: grow rather than lose the timing
            event = torch.cuda.Event(enable_timing=True)
        _record(event, stream)
        return event

    # ------------------------------------------------------------------ publisher thread

    def enter_thread(self) -> None:
        """Let the publisher thread query events while the training thread captures a CUDA graph.

        Under the default capture mode (global), a ``cudaEventQuery`` from *any* thread during a capture is
        an unsafe call that invalidates it: the user's ``torch.cuda.graph`` would fail because of dagtop.
        Switching this thread to the relaxed mode (a driver call, thread-local, as NCCL's watchdog does)
        takes it out of that rule. Without the driver library there is no GPU work to protect.
        """
        try:
            driver = ctypes.CDLL("libcuda.so.1")
            mode = ctypes.c_int(CU_STREAM_CAPTURE_MODE_RELAXED)
            driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        except (OSError, AttributeError):
            pass

    def calibrate(self) -> None:
        """Pair a GPU timestamp with ``perf_counter_ns``: an event on an otherwise idle stream, waited for.

        ``synchronize()`` waits without the GIL (the training thread never waits on this one), on an
        event of dagtop's own stream: it synchronises nothing of the job's. elapsed_time is float32
        milliseconds, so anchors are renewed about once a second to keep the conversion within a fraction
        of a microsecond.
        """
        with torch.cuda.device(self.device):
            anchor = torch.cuda.Event(enable_timing=True)
            begin = time.perf_counter_ns()
            anchor.record(self._anchor_stream)
            anchor.synchronize()
            now = time.perf_counter_ns()
        # A slow anchor (the GPU front end was busy) is worse than the last one, but better than none.
        if self._anchor is None or now - begin <= CALIBRATION_WAIT_NS:
            self._anchor_ns, self._anchor = now, anchor

    def ready(self, events: Sequence[RawEvent]) -> bool:
        """True once the GPU has passed every stamp of the iteration (``query()`` never waits).

        Polled every few milliseconds while the GPU runs behind: it resumes where the last poll stopped,
        so an iteration's stamps are queried about once each, not once per poll.
        """
        start = self._waiting[1] if self._waiting[0] is events else 0
        for i in range(start, len(events)):
            ev = events[i]
            for stamp in (ev[4], ev[5]):
                if stamp is not None and not isinstance(stamp, int) and not stamp.query():
                    self._waiting = (events, i)
                    return False
        self._waiting = (None, 0)
        return True

    def resolve(self, events: Sequence[RawEvent]) -> list[RawEvent]:
        """Replace every event's CUDA stamps by CPU nanoseconds and give the events back to the pool."""
        if self._anchor is None:
            self.calibrate()
        # One stamp may end a block's backward and start the next one's: convert and give back each once.
        ns: dict[int, int] = {}
        for ev in events:
            for stamp in (ev[4], ev[5]):
                if stamp is not None and not isinstance(stamp, int) and id(stamp) not in ns:
                    ns[id(stamp)] = self._to_ns(stamp)
                    self._free.append(stamp)
        out = []
        for ev in events:
            start, end = ev[4], ev[5]
            if start is None or end is None:  # stamped during a CUDA-graph capture
                continue
            start = start if isinstance(start, int) else ns[id(start)]
            end = end if isinstance(end, int) else ns[id(end)]
            out.append((ev[0], ev[1], ev[2], ev[3], max(0, start), max(0, start, end), ev[6]))
        return out

    def _to_ns(self, event: torch.cuda.Event) -> int:
        if self._anchor is None:  # no calibration succeeded yet: the best we have is "now"
            return time.perf_counter_ns()
        elapsed_ms: float = self._anchor.elapsed_time(event)
        return self._anchor_ns + round(elapsed_ms * 1e6)


def move_timed(
    timing: CudaTiming, batch: Any, device: torch.device
) -> tuple[Any, int, torch.cuda.Event | None, torch.cuda.Event | None]:
    """Copy ``batch`` to the GPU on the current stream between two events.

    The destinations are allocated first, so only the copies sit between the two events (an allocation
    inside them would count launch latency as PCIe time, which on a small copy is most of it). The copies
    stay on the training stream, in the order the job would run them: a dedicated copy stream that the
    compute stream must wait for at once buys no overlap, and on the H100 it cost ResNet-50 about 1.4
    points of step time more than this (benchmarks/gpu_truth.py --only overhead). Copies from pageable
    memory are synchronous for the host anyway; from pinned memory they run asynchronously.
    """
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def empty_like(tensor: torch.Tensor) -> torch.Tensor:
        dst = torch.empty_like(tensor, device=device)
        pairs.append((dst, tensor))
        return dst

    out = map_tensors(batch, empty_like)
    start = timing.stamp()
    for dst, src in pairs:
        dst.copy_(src, non_blocking=True)
    end = timing.stamp()
    return out, sum(src.numel() * src.element_size() for _, src in pairs), start, end
