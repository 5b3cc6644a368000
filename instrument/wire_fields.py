"""What the frames of instrument/wire.py are built from: the header every frame opens with, the fields several
frames share, the maps nested in frames, the bounds on their values, and the two layouts of an iteration's events.

Declared like the frames (instrument/schema.py's :func:`~instrument.schema.wire` metadata), so the codec and
docs/wire.md read them the same way. Stdlib only, no effects at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from instrument.events import CATEGORIES, CATEGORY_CODE, LANE_CODE, LANES, PHASE_CODE, PHASES
from instrument.schema import AddedInt, FieldType, Int, OptFloat, OptInt, Str, WireError, wire
from instrument.wire_events import ColumnarEvents, Count, EventList, Name, Vocabulary

__all__ = ["COLUMNS", "DROPPED", "DROPPED_QUEUE", "EVENTS", "MAX_EVENTS_PER_FRAME", "MAX_JOB_CHARS", "MAX_NAME_CHARS",
           "MAX_NOTE_CHARS", "MAX_RANKS", "MAX_RATE", "SENDER", "Bucket", "BucketList", "GpuStats", "Header",
           "HostStats", "Loader"]

MAX_NAME_CHARS: Final = 256
MAX_EVENTS_PER_FRAME: Final = 1_000_000
MAX_NOTE_CHARS: Final = 256
MAX_JOB_CHARS: Final = 256
MAX_RATE: Final = 1e15
"""Bytes per second, watts: far above any real reading, low enough to refuse garbage."""
MAX_RANKS: Final = 1 << 20
"""Ranks in a job (and CPUs on a host): a bound that refuses garbage, not a limit anyone reaches."""

EVENTS: Final = EventList(MAX_EVENTS_PER_FRAME, (
    Vocabulary("category", CATEGORIES, CATEGORY_CODE), Vocabulary("phase", PHASES, PHASE_CODE),
    Name("name", MAX_NAME_CHARS), Vocabulary("lane", LANES, LANE_CODE),
    Count("start_ns", "start"), Count("end_ns", "end"), Count("bytes", "bytes")))
"""A version-1 ``iter`` frame's events: one list per event, in :class:`~instrument.events.Event`'s field order."""
COLUMNS: Final = ColumnarEvents(MAX_EVENTS_PER_FRAME, MAX_NAME_CHARS)
"""A version-2 ``iter`` frame's events: one typed column per field."""


@dataclass(frozen=True, slots=True)
class Header:
    """The keys every frame opens with, after ``v`` and ``k``: a frame is a subclass, its own fields after these."""

    KIND: ClassVar[str]
    """The frame's ``k``."""
    WHEN: ClassVar[str]
    """When a rank sends it, as docs/wire.md says."""

    seq: int = field(metadata=wire(Int(), "frames this rank has tried to send before this one, all kinds together"))
    rank: int = field(metadata=wire(Int(0, MAX_RANKS), "the sending rank, as torch.distributed numbers it"))


DROPPED: Final = wire(Int(), "iteration frames this rank has discarded so far (cumulative)")
DROPPED_QUEUE: Final = wire(AddedInt(), "of `dropped`, those the training thread discarded because the publisher's "
                                        "queue was full (the rest the rank's socket refused: the link or the monitor "
                                        "not keeping up); 0 from older ranks")
SENDER: Final = wire(AddedInt(0, 2**31 - 1), "the sending process: a number the shim picks at random when it "
                                             "attaches (a restarted rank picks another); 0 from older ranks")


def _used_within_total(values: Mapping[str, Any], where: str) -> None:
    used, total = values["mem_used"], values["mem_total"]
    if used is not None and total is not None and used > total:
        raise WireError(f"{where}: mem_used {used} exceeds mem_total {total}")


@dataclass(frozen=True, slots=True)
class Loader:
    """The DataLoader a rank iterates through ``tracer.loader(...)``, as its settings say: what the advisor needs to
    say how many workers to use and how long an epoch is."""

    workers: int = field(metadata=wire(Int(0, MAX_RANKS), "`num_workers`"))
    batch_size: int | None = field(metadata=wire(OptInt(1), "samples per batch; nil when the loader has no "
                                                            "`batch_size` (a batch sampler of its own)"))
    batches: int | None = field(metadata=wire(OptInt(), "`len(loader)`: batches per epoch on this rank; nil for an "
                                                        "iterable without a length"))
    prefetch_factor: int | None = field(metadata=wire(OptInt(), "batches each worker loads ahead; nil without "
                                                                "workers"))
    pin_memory: int = field(metadata=wire(Int(0, 1), "1 if `pin_memory=True`"))
    persistent_workers: int = field(metadata=wire(Int(0, 1), "1 if `persistent_workers=True`"))
    wait_cpu_permille: int | None = field(default=None, metadata=wire(
        OptInt(0, 1000), "the training thread's CPU time inside `next()` per thousand of its wall time there, "
                         "recent batches weighing most: without workers, how much of making a batch is CPU work; "
                         "nil before the first batch"))


@dataclass(frozen=True, slots=True)
class Bucket:
    """One DDP gradient bucket: what an all-reduce carries."""

    index: int
    bytes: int
    parameters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BucketList(FieldType):
    """A rank's buckets: a list of ``[index, bytes, [parameter names]]``."""

    def decode(self, value: Any, key: str, where: str) -> tuple[Bucket, ...]:
        if not isinstance(value, list):
            raise WireError(f"field {key!r} must be a list")
        buckets = []
        for i, b in enumerate(value):
            if not (isinstance(b, list) and len(b) == 3 and isinstance(b[2], list)):
                raise WireError(f"bucket {i} must be [index, bytes, [parameter names]]")
            index, size, names = b
            if type(index) is not int or type(size) is not int or index < 0 or size < 0:
                raise WireError(f"bucket {i}: index and bytes must be non-negative integers")
            if not all(isinstance(n, str) and len(n) <= MAX_NAME_CHARS for n in names):
                raise WireError(f"bucket {i}: parameter names must be strings")
            buckets.append(Bucket(index, size, tuple(names)))
        return tuple(buckets)

    def encode(self, value: Any) -> list[list[Any]]:
        return [[b.index, b.bytes, list(b.parameters)] for b in value]

    def describe(self) -> str:
        return "list of `[index, bytes, [parameter names]]`"


@dataclass(frozen=True, slots=True)
class HostStats:
    """Host-wide figures of a rank's machine; None where the host does not offer one (no /proc)."""

    cpu_percent: float | None = field(metadata=wire(
        OptFloat(100.0), "busy share of all CPUs since the previous sample, in %", key="cpu"))
    cpus: int | None = field(metadata=wire(OptInt(1, MAX_RANKS), "CPU count"))
    mem_used: int | None = field(metadata=wire(OptInt(), "bytes: `MemTotal` − `MemAvailable`"))
    mem_total: int | None = field(metadata=wire(
        OptInt(), "bytes: `MemTotal`, the host's (not a container's limit); not below `mem_used`",
        check=_used_within_total))


@dataclass(frozen=True, slots=True)
class GpuStats:
    """The rank's own GPU as NVML reads it; None where the device does not support a figure."""

    index: int = field(metadata=wire(
        Int(0, 1 << 16), "NVML's index on its host: the number `nvidia-smi` shows, whatever "
                         "CUDA_VISIBLE_DEVICES says"))
    name: str = field(metadata=wire(Str(MAX_NAME_CHARS), "the device's name, as NVML gives it"))
    util_percent: float | None = field(metadata=wire(OptFloat(100.0), "utilisation, in %", key="util"))
    mem_used: int | None = field(metadata=wire(OptInt(), "bytes"))
    mem_total: int | None = field(metadata=wire(OptInt(), "bytes; not below `mem_used`", check=_used_within_total))
    pcie_tx: float | None = field(metadata=wire(
        OptFloat(MAX_RATE), "bytes per second the GPU sent over PCIe (NVML samples a 20 ms window)"))
    pcie_rx: float | None = field(metadata=wire(OptFloat(MAX_RATE), "bytes per second the GPU received"))
    power_w: float | None = field(metadata=wire(OptFloat(MAX_RATE), "watts"))
