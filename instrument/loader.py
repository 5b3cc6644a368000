"""A DataLoader's settings as the hello carries them: what the advisor needs for its input-pipeline advice."""

from __future__ import annotations

from typing import Any

from instrument.wire_fields import MAX_RANKS, Loader


def describe_loader(iterable: Any) -> Loader | None:
    """``iterable``'s settings if it looks like a ``torch.utils.data.DataLoader`` (it has ``num_workers``), else None.

    Read by attribute, never by importing torch: any loader that keeps DataLoader's names is described. Never
    raises: a loader whose ``len()`` fails (an iterable dataset) has no batch count.
    """
    try:
        workers = getattr(iterable, "num_workers", None)
        if type(workers) is not int or not 0 <= workers <= MAX_RANKS:
            return None
        batch = getattr(iterable, "batch_size", None)
        try:
            batches: int | None = len(iterable)
        except Exception:  # noqa: BLE001 - an IterableDataset without __len__ raises TypeError; others anything
            batches = None
        prefetch = getattr(iterable, "prefetch_factor", None) if workers else None
        return Loader(
            workers=workers,
            batch_size=batch if type(batch) is int and batch >= 1 else None,
            batches=batches if type(batches) is int and batches >= 0 else None,
            prefetch_factor=prefetch if type(prefetch) is int and prefetch >= 0 else None,
            pin_memory=int(bool(getattr(iterable, "pin_memory", False))),
            persistent_workers=int(bool(getattr(iterable, "persistent_workers", False))),
        )
    except Exception:  # noqa: BLE001 - a property of a user's loader may raise anything: the shim never does
        return None


class WaitShare:
    """The training thread's CPU time inside the loader's ``next()`` against its wall time there, both decayed by
    :data:`DECAY` a batch (the last hundred or so weigh most). Written by the training thread, read by the
    publisher's: two floats, a read a batch stale at worst."""

    __slots__ = ("cpu", "wall")

    DECAY = 0.98

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def add(self, cpu_ns: int, wall_ns: int) -> None:
        self.cpu = self.cpu * self.DECAY + cpu_ns
        self.wall = self.wall * self.DECAY + wall_ns

    def permille(self) -> int | None:
        """CPU per thousand of wall time, None before any batch."""
        if self.wall <= 0:
            return None
        return max(0, min(1000, round(1000 * self.cpu / self.wall)))
