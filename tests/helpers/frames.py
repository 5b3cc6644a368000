"""Frames made by hand: a rank's hello with plain values, and a frame source that hands out a prepared list."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from dagtop.io.sources import FrameSource
from dagtop.model.frames import RawFrame
from instrument import wire


def hello(rank: int = 0, world: int = 1, seq: int = 0, **fields: Any) -> wire.Hello:
    """Rank ``rank`` of a ``world``-rank job introducing itself, from host ``h`` (pid 1, a CPU, model ``M``, block
    granularity, clocks at 1 ns); any other field as a keyword (``pid=os.getpid()``, ``mono_ns=...``)."""
    plain = wire.Hello(seq, rank, world, rank, "h", 1, "cpu", "t", "M", 1, "block", 1, 1)
    return dataclasses.replace(plain, **fields)


class ListSource(FrameSource):
    """Hands out prepared frames ``batch`` at a time (all it may at once by default), then finishes; or, given
    ``end``, raises it once they are out (a source that fails mid-run). Safe to poll from a worker thread."""

    def __init__(self, frames: list[RawFrame], batch: int | None = None, end: BaseException | None = None) -> None:
        self._frames = list(frames)
        self._batch = batch
        self._end = end
        self._lock = threading.Lock()

    @classmethod
    def of_payloads(cls, payloads: list[bytes], batch: int | None = None,
                    end: BaseException | None = None) -> ListSource:
        """Payloads received at 0, 1, 2, … ns."""
        return cls([RawFrame(i, p) for i, p in enumerate(payloads)], batch, end)

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        with self._lock:
            if not self._frames and self._end is not None:
                raise self._end
            n = max_frames if self._batch is None else min(self._batch, max_frames)
            out, self._frames = self._frames[:n], self._frames[n:]
            return out

    @property
    def finished(self) -> bool:
        with self._lock:
            return not self._frames and self._end is None
