"""The wire format: the one msgpack schema that training ranks and the monitor both speak.

Every frame is a msgpack map with a wire version ``v`` and a kind ``k``. Events travel as
fixed-order lists (five times smaller than maps and ten times faster than JSON, see
FIELD_NOTES). Decoding validates every field and raises :class:`WireError` with a reason;
it never executes anything from the wire (no pickle, no ext types).

Frames (version 1):

``hello``   {v, k, seq, rank, world, local_rank, host, pid, device, torch, model, params,
             granularity, wall_ns, mono_ns}
``iter``    {v, k, seq, rank, it, ev: [[category, phase, name, lane, start_ns, end_ns, bytes], ...],
             dropped}
``buckets`` {v, k, seq, rank, buckets: [[index, bytes, [parameter names]], ...]}
``bye``     {v, k, seq, rank, iterations, dropped}
``telemetry`` {v, k, seq, rank, host, local_rank, mono_ns, note,
             hw: nil | {cpu, cpus, mem_used, mem_total},
             gpu: nil | {index, name, util, mem_used, mem_total, pcie_tx, pcie_rx, power_w}}
            about every 2 s from a background thread; ``hw`` (host-wide) only from local rank 0, ``gpu``
            from every rank on a GPU that NVML can read. Any figure may be nil: not measurable there.

Times are ``time.perf_counter_ns()`` of the rank's host (CLOCK_MONOTONIC): comparable between
processes of one host, not across hosts. ``dropped`` is the number of events or frames the
rank's publisher discarded so far (cumulative), reported in band. ``seq`` counts the frames
a rank has tried to send, so the monitor can count what the network lost.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Union

import msgpack

from instrument.events import CATEGORIES, CATEGORY_CODE, LANE_CODE, LANES, PHASE_CODE, PHASES, Event, EventColumns

__all__ = ["CATEGORIES", "LANES", "PHASES", "WIRE_VERSION", "Bucket", "Buckets", "Bye", "Event", "EventColumns",
           "Frame", "GpuStats", "Hello", "HostStats", "IterationBatch", "Telemetry", "WireError", "decode", "encode"]

WIRE_VERSION: Final = 1

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
MAX_NAME_CHARS: Final = 256
MAX_EVENTS_PER_FRAME: Final = 1_000_000
MAX_NOTE_CHARS: Final = 256
MAX_RATE: Final = 1e15
"""Bytes per second, watts: far above any real reading, low enough to refuse garbage."""
_INT64_MAX: Final = 2**63 - 1


class WireError(ValueError):
    """A frame that does not fit the schema; the message says why."""


@dataclass(frozen=True, slots=True)
class Hello:
    """A rank introduces itself once, when it attaches (and again if it reconnects)."""

    seq: int
    rank: int
    world: int
    local_rank: int
    host: str
    pid: int
    device: str
    torch: str
    model: str
    params: int
    granularity: str
    wall_ns: int
    mono_ns: int


@dataclass(frozen=True, slots=True)
class IterationBatch:
    """All events of one rank for one iteration: one message per rank per iteration."""

    seq: int
    rank: int
    iteration: int
    events: Sequence[Event]
    """Decoded frames carry :class:`EventColumns`; any sequence of events encodes."""
    dropped: int


@dataclass(frozen=True, slots=True)
class Bucket:
    """One DDP gradient bucket: what an all-reduce carries."""

    index: int
    bytes: int
    parameters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Buckets:
    """The bucket to parameters map of one rank, sent once the buckets are final."""

    seq: int
    rank: int
    buckets: tuple[Bucket, ...]


@dataclass(frozen=True, slots=True)
class Bye:
    """A rank detaches cleanly."""

    seq: int
    rank: int
    iterations: int
    dropped: int


@dataclass(frozen=True, slots=True)
class HostStats:
    """Host-wide figures of a rank's machine; None where the host does not offer one (no /proc)."""

    cpu_percent: float | None
    """All cores together, 0 to 100, over the interval since the previous sample."""
    cpus: int | None
    mem_used: int | None
    """Bytes: total minus available."""
    mem_total: int | None


@dataclass(frozen=True, slots=True)
class GpuStats:
    """The rank's own GPU as NVML reads it; None where the device does not support a figure."""

    index: int
    """NVML's index on its host: the number ``nvidia-smi`` shows, whatever CUDA_VISIBLE_DEVICES says."""
    name: str
    util_percent: float | None
    mem_used: int | None
    """Bytes."""
    mem_total: int | None
    pcie_tx: float | None
    """Bytes per second the GPU sent over PCIe (NVML samples a 20 ms window)."""
    pcie_rx: float | None
    power_w: float | None


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One rank's sample of its host and its GPU, sent about every 2 s."""

    seq: int
    rank: int
    host: str
    local_rank: int
    mono_ns: int
    """The rank's ``perf_counter_ns()`` when it sampled."""
    host_stats: HostStats | None
    """Only from local rank 0 of each host: one sender is enough."""
    gpu: GpuStats | None
    """None on a CPU rank, or when NVML is missing (``note`` says why)."""
    note: str = ""
    """Why figures are missing, worded to follow the rank: "on CPU", "no GPU figures: NVML library not found"."""


Frame = Union[Hello, IterationBatch, Buckets, Bye, Telemetry]


# --------------------------------------------------------------------------- encoding


def _pack(obj: dict[str, Any]) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_hello(h: Hello) -> bytes:
    return _pack(
        {
            "v": WIRE_VERSION,
            "k": "hello",
            "seq": h.seq,
            "rank": h.rank,
            "world": h.world,
            "local_rank": h.local_rank,
            "host": h.host,
            "pid": h.pid,
            "device": h.device,
            "torch": h.torch,
            "model": h.model,
            "params": h.params,
            "granularity": h.granularity,
            "wall_ns": h.wall_ns,
            "mono_ns": h.mono_ns,
        }
    )


def encode_iteration(
    seq: int, rank: int, iteration: int, events: Sequence[Event] | list[tuple[Any, ...]], dropped: int
) -> bytes:
    """Encode one rank's iteration; ``events`` may be plain 7-tuples (the shim's hot path)."""
    return _pack(
        {"v": WIRE_VERSION, "k": "iter", "seq": seq, "rank": rank, "it": iteration, "ev": events, "dropped": dropped}
    )


def encode_buckets(b: Buckets) -> bytes:
    return _pack(
        {
            "v": WIRE_VERSION,
            "k": "buckets",
            "seq": b.seq,
            "rank": b.rank,
            "buckets": [[x.index, x.bytes, list(x.parameters)] for x in b.buckets],
        }
    )


def encode_bye(b: Bye) -> bytes:
    return _pack(
        {"v": WIRE_VERSION, "k": "bye", "seq": b.seq, "rank": b.rank, "iterations": b.iterations, "dropped": b.dropped}
    )


def encode_telemetry(t: Telemetry) -> bytes:
    h, g = t.host_stats, t.gpu
    return _pack(
        {
            "v": WIRE_VERSION,
            "k": "telemetry",
            "seq": t.seq,
            "rank": t.rank,
            "host": t.host,
            "local_rank": t.local_rank,
            "mono_ns": t.mono_ns,
            "note": t.note,
            "hw": None if h is None else
            {"cpu": h.cpu_percent, "cpus": h.cpus, "mem_used": h.mem_used, "mem_total": h.mem_total},
            "gpu": None if g is None else
            {"index": g.index, "name": g.name, "util": g.util_percent, "mem_used": g.mem_used,
             "mem_total": g.mem_total, "pcie_tx": g.pcie_tx, "pcie_rx": g.pcie_rx, "power_w": g.power_w},
        }
    )


def encode(frame: Frame) -> bytes:
    """Encode any frame."""
    if isinstance(frame, Hello):
        return encode_hello(frame)
    if isinstance(frame, IterationBatch):
        return encode_iteration(frame.seq, frame.rank, frame.iteration, list(frame.events), frame.dropped)
    if isinstance(frame, Buckets):
        return encode_buckets(frame)
    if isinstance(frame, Bye):
        return encode_bye(frame)
    if isinstance(frame, Telemetry):
        return encode_telemetry(frame)
    raise TypeError(f"not a wire frame: {type(frame).__name__}")


# --------------------------------------------------------------------------- decoding


def _int(m: dict[Any, Any], key: str, lo: int = 0, hi: int = _INT64_MAX) -> int:
    value = m.get(key)
    if type(value) is not int:  # bool is an int subclass: refuse it too
        raise WireError(f"field {key!r} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise WireError(f"field {key!r} = {value} is out of range [{lo}, {hi}]")
    return value


def _str(m: dict[Any, Any], key: str, limit: int = MAX_NAME_CHARS) -> str:
    value = m.get(key)
    if not isinstance(value, str):
        raise WireError(f"field {key!r} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise WireError(f"field {key!r} is longer than {limit} characters")
    return value


def _opt_int(m: dict[Any, Any], key: str, where: str) -> int | None:
    value = m.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= _INT64_MAX:
        raise WireError(f"{where}: field {key!r} must be nil or a non-negative integer, got {value!r:.40}")
    return value


def _opt_float(m: dict[Any, Any], key: str, where: str, hi: float = MAX_RATE) -> float | None:
    value = m.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= hi:
        raise WireError(f"{where}: field {key!r} must be nil or a number in [0, {hi:g}], got {value!r:.40}")
    return float(value)


def _used_total(m: dict[Any, Any], where: str) -> tuple[int | None, int | None]:
    used, total = _opt_int(m, "mem_used", where), _opt_int(m, "mem_total", where)
    if used is not None and total is not None and used > total:
        raise WireError(f"{where}: mem_used {used} exceeds mem_total {total}")
    return used, total


def _telemetry(m: dict[Any, Any], seq: int, rank: int) -> Telemetry:
    note = m.get("note", "")
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise WireError(f"field 'note' must be a string of at most {MAX_NOTE_CHARS} characters")
    hw, gpu = m.get("hw"), m.get("gpu")
    host_stats = gpu_stats = None
    if hw is not None:
        if not isinstance(hw, dict):
            raise WireError(f"field 'hw' must be nil or a map, got {type(hw).__name__}")
        cpus = _opt_int(hw, "cpus", "hw")
        if cpus is not None and not 1 <= cpus <= 1 << 20:
            raise WireError(f"hw: field 'cpus' = {cpus} is out of range [1, {1 << 20}]")
        host_stats = HostStats(_opt_float(hw, "cpu", "hw", 100.0), cpus, *_used_total(hw, "hw"))
    if gpu is not None:
        if not isinstance(gpu, dict):
            raise WireError(f"field 'gpu' must be nil or a map, got {type(gpu).__name__}")
        gpu_stats = GpuStats(
            _int(gpu, "index", 0, 1 << 16), _str(gpu, "name"), _opt_float(gpu, "util", "gpu", 100.0),
            *_used_total(gpu, "gpu"), _opt_float(gpu, "pcie_tx", "gpu"), _opt_float(gpu, "pcie_rx", "gpu"),
            _opt_float(gpu, "power_w", "gpu"),
        )
    return Telemetry(seq, rank, _str(m, "host"), _int(m, "local_rank", 0, 1 << 20), _int(m, "mono_ns"),
                     host_stats, gpu_stats, note)


def _event(raw: Any, index: int) -> Event:
    if not isinstance(raw, (list, tuple)) or len(raw) != 7:
        raise WireError(f"event {index} must be a list of 7 fields")
    category, phase, name, lane, start, end, size = raw
    if category not in CATEGORIES:
        raise WireError(f"event {index}: unknown category {category!r}")
    if phase not in PHASES:
        raise WireError(f"event {index}: unknown phase {phase!r}")
    if lane not in LANES:
        raise WireError(f"event {index}: unknown lane {lane!r}")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
        raise WireError(f"event {index}: name must be a string of at most {MAX_NAME_CHARS} characters")
    for label, value in (("start", start), ("end", end), ("bytes", size)):
        if type(value) is not int or not 0 <= value <= _INT64_MAX:
            raise WireError(f"event {index}: {label} must be a non-negative integer")
    if end < start:
        raise WireError(f"event {index} ({name}): ends before it starts")
    return Event(category, phase, name, lane, start, end, size)


class _Misfit(Exception):
    """The fast column checks found something wrong; the event-by-event check says what."""


_EVENT_ROW_TYPES: Final = frozenset((list, tuple))


def _events(raw: list[Any]) -> EventColumns:
    """Validate and transpose a frame's events, a whole field at a time (C loops, no Python per event).

    Anything the column checks refuse goes through :func:`_event` one event at a time, which raises the
    precise reason: that function is the schema; these checks must accept exactly what it accepts
    (tests/test_wire.py spoils every field to hold them to it).
    """
    if not raw:
        return EventColumns.of(())
    try:
        if not set(map(type, raw)) <= _EVENT_ROW_TYPES or set(map(len, raw)) != {7}:
            raise _Misfit
        category, phase, name, lane, start, end, size = zip(*raw)
        columns = EventColumns(
            array("b", map(CATEGORY_CODE.__getitem__, category)), array("b", map(PHASE_CODE.__getitem__, phase)),
            name, array("b", map(LANE_CODE.__getitem__, lane)), array("q", start), array("q", end), array("q", size))
        if set(map(type, name)) != {str} or max(map(len, name)) > MAX_NAME_CHARS:
            raise _Misfit
        if set(map(type, start)) | set(map(type, end)) | set(map(type, size)) != {int}:  # no bool, no float
            raise _Misfit
        if min(columns.start_ns) < 0 or min(columns.bytes) < 0 or any(map(operator.gt, start, end)):
            raise _Misfit
    except (_Misfit, KeyError, TypeError, OverflowError):
        for i, e in enumerate(raw):
            _event(e, i)
        raise WireError("events do not fit the schema") from None
    return columns


def decode(payload: bytes) -> Frame:
    """Decode and validate one frame.

    Raises:
        WireError: with a reason, for anything that is not a well-formed frame of this version.
    """
    if len(payload) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        m = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError(f"not msgpack: {exc}") from None
    if not isinstance(m, dict):
        raise WireError(f"frame must be a map, got {type(m).__name__}")
    version = m.get("v")
    if version != WIRE_VERSION:
        raise WireError(f"wire version {version!r} is not supported (this monitor speaks version {WIRE_VERSION})")
    kind = m.get("k")
    seq = _int(m, "seq")
    rank = _int(m, "rank", 0, 1 << 20)
    if kind == "iter":
        raw_events = m.get("ev")
        if not isinstance(raw_events, list) or len(raw_events) > MAX_EVENTS_PER_FRAME:
            raise WireError("field 'ev' must be a list of events")
        return IterationBatch(seq, rank, _int(m, "it"), _events(raw_events), _int(m, "dropped"))
    if kind == "hello":
        world = _int(m, "world", 1, 1 << 20)
        if rank >= world:
            raise WireError(f"rank {rank} is not below world size {world}")
        return Hello(
            seq,
            rank,
            world,
            _int(m, "local_rank", 0, 1 << 20),
            _str(m, "host"),
            _int(m, "pid"),
            _str(m, "device"),
            _str(m, "torch"),
            _str(m, "model"),
            _int(m, "params"),
            _str(m, "granularity"),
            _int(m, "wall_ns"),
            _int(m, "mono_ns"),
        )
    if kind == "buckets":
        raw_buckets = m.get("buckets")
        if not isinstance(raw_buckets, list):
            raise WireError("field 'buckets' must be a list")
        buckets = []
        for i, b in enumerate(raw_buckets):
            if not (isinstance(b, list) and len(b) == 3 and isinstance(b[2], list)):
                raise WireError(f"bucket {i} must be [index, bytes, [parameter names]]")
            index, size, names = b
            if type(index) is not int or type(size) is not int or index < 0 or size < 0:
                raise WireError(f"bucket {i}: index and bytes must be non-negative integers")
            if not all(isinstance(n, str) and len(n) <= MAX_NAME_CHARS for n in names):
                raise WireError(f"bucket {i}: parameter names must be strings")
            buckets.append(Bucket(index, size, tuple(names)))
        return Buckets(seq, rank, tuple(buckets))
    if kind == "bye":
        return Bye(seq, rank, _int(m, "iterations"), _int(m, "dropped"))
    if kind == "telemetry":
        return _telemetry(m, seq, rank)
    raise WireError(f"unknown frame kind {kind!r}")
