"""The frame as the monitor received it: what every source yields, recordings store and the model folds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RawFrame:
    """One frame as received: the bytes and the monitor's monotonic receive time."""

    received_ns: int
    payload: bytes
