"""The wire format, the one msgpack schema that training ranks and the monitor both speak: its frames and their codec.

Each frame below is a dataclass whose fields carry their wire key, type and meaning; what frames are built from
(the header every frame opens with, shared fields, nested maps, bounds) is in instrument/wire_fields.py. The
codec walks that description (instrument/schema.py), and so does instrument/wire_docs.py, which writes the frame
tables of docs/wire.md. That page says what the values mean; read it rather than repeat it here. Decoding
validates every field and raises :class:`WireError` with a reason; it never executes anything from the wire
(no pickle, no ext types).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, NamedTuple

import msgpack

from instrument.events import CATEGORIES, LANES, PHASES, Event, EventColumns
from instrument.schema import (
    Added,
    AddedInt,
    AddedIntLists,
    AddedMap,
    Int,
    Layout,
    Map,
    Str,
    Text,
    WireError,
    layout_of,
    wire,
)
from instrument.wire_fields import (
    COLUMNS,
    DROPPED,
    DROPPED_QUEUE,
    EVENTS,
    MAX_EVENTS_PER_FRAME,
    MAX_JOB_CHARS,
    MAX_NAME_CHARS,
    MAX_NOTE_CHARS,
    MAX_RANKS,
    SENDER,
    Bucket,
    BucketList,
    GpuStats,
    Header,
    HostStats,
    Loader,
)

__all__ = ["CATEGORIES", "DEFAULT_ENDPOINT", "LANES", "PHASES", "WIRE_VERSION", "Buckets", "Bye", "Event",
           "EventColumns", "Frame", "Heartbeat", "Hello", "IterationBatch", "Telemetry", "ThreadCpu",
           "WireError",
           "decode", "encode", "encode_iteration"]

WIRE_VERSION: Final = 2
"""What a rank sends. Version 2 carries an iteration's events as typed columns; nothing else changed."""
READ_VERSIONS: Final = (1, 2)
"""What a monitor reads: version-1 ranks and recordings too."""

DEFAULT_ENDPOINT: Final = "tcp://127.0.0.1:5555"
"""Where the monitor binds and a rank connects unless told otherwise (``--bind``, ``$DAGTOP_ENDPOINT``)."""

MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
"""The largest frame either side handles (~80 000 events at ~50 bytes each). It bounds the monitor's memory:
msgpack turns one byte into up to ~64 bytes of Python objects (an empty list or map), so decoding one frame
takes at most ~270 MB. The monitor's socket refuses larger messages before they are read (``MAXMSGSIZE``);
a rank drops and counts a frame that would exceed it."""
MAX_STRING_BYTES: Final = 64 * 1024
"""Any one string in a frame, known key or not: every string the schema knows is far shorter."""
MAX_MAP_KEYS: Final = 64
"""Keys of any one map in a frame: a frame has about ten, a nested map fewer."""


def _rank_below_world(values: Mapping[str, Any], where: str) -> None:
    if values["rank"] >= values["world"]:
        raise WireError(f"rank {values['rank']} is not below world size {values['world']}")


def _bytes_per_name(values: Mapping[str, Any], where: str) -> None:
    sizes, buckets = values["parameter_bytes"], values["buckets"]
    if sizes and (len(sizes) != len(buckets) or any(len(s) != len(b.parameters) or sum(s) != b.bytes
                                                    for s, b in zip(sizes, buckets))):
        raise WireError("param_bytes must give each bucket's parameters their bytes, adding up to the bucket's")


@dataclass(frozen=True, slots=True)
class Hello(Header):
    """A rank introduces itself when it attaches, and again every few seconds: who it is, and in which job.

    ``job``, ``master``, ``restart`` and ``started_ns`` say which job, which incarnation of it and which process:
    the monitor follows one job, and takes a restart (torchrun's count up, or new processes for its ranks) as a
    new run of it."""

    KIND: ClassVar[str] = "hello"
    WHEN: ClassVar[str] = "at attach, 0.2 s and 0.7 s later, then every 2 s"

    world: int = field(metadata=wire(Int(1, MAX_RANKS), "ranks in the job; `rank` is below it",
                                     check=_rank_below_world))
    local_rank: int = field(metadata=wire(Int(0, MAX_RANKS), "the rank's index on its host"))
    host: str = field(metadata=wire(Str(MAX_NAME_CHARS), "`socket.gethostname()`"))
    pid: int = field(metadata=wire(Int(), "the rank's process id"))
    device: str = field(metadata=wire(Str(MAX_NAME_CHARS), "where the model is: `cpu`, `cuda:0`"))
    torch: str = field(metadata=wire(Str(MAX_NAME_CHARS), "torch's version"))
    model: str = field(metadata=wire(Str(MAX_NAME_CHARS), "class name of the unwrapped model"))
    params: int = field(metadata=wire(Int(), "parameter count"))
    granularity: str = field(metadata=wire(Str(MAX_NAME_CHARS), "`block` or `layer`, as passed to `attach`"))
    wall_ns: int = field(metadata=wire(Int(), "`time.time_ns()`, read together with `mono_ns`"))
    mono_ns: int = field(metadata=wire(Int(), "`time.perf_counter_ns()`: the pair places the rank's times "
                                              "on the wall clock"))
    units: str = field(default="", metadata=wire(Added(MAX_NAME_CHARS), "the timed units as attach found them: "
                                                   "`6 blocks: embed, layers.0…3, head`; empty from older ranks"))
    job: str = field(default="", metadata=wire(Added(MAX_JOB_CHARS), "torchrun's run id (`TORCHELASTIC_RUN_ID`, "
                                                                     "its `--rdzv-id`); empty outside torchrun"))
    master: str = field(default="", metadata=wire(Added(MAX_JOB_CHARS), "`MASTER_ADDR:MASTER_PORT`, where the job's "
                                                                        "ranks meet; empty where unset"))
    restart: int = field(default=0, metadata=wire(AddedInt(0, MAX_RANKS), "torchrun's restart count "
                                                                         "(`TORCHELASTIC_RESTART_COUNT`): 0 in the "
                                                                         "job's first incarnation"))
    started_ns: int = field(default=0, metadata=wire(AddedInt(), "`time.time_ns()` when the shim attached in this "
                                                                 "process; 0 from older ranks"))
    sender: int = field(default=0, metadata=SENDER)
    loader: Loader | None = field(default=None, metadata=wire(
        AddedMap(Loader), "the DataLoader given to `tracer.loader()`, once it is; absent before, or for an iterable "
                          "that is not a DataLoader"))


class ThreadCpu(NamedTuple):
    """The training thread's CPU time over one iteration (``time.thread_time_ns``), parts of it, and the process's
    beside it."""

    total_ns: int
    update_ns: int
    """The optimizer's step."""
    load_ns: int
    """The loader's ``next()``."""
    shim_ns: int = 0
    """The shim's own time in its hooks (``perf_counter_ns``: on a CPU rank the thread's, as good as its CPU
    time); 0 where not measured (older shims)."""
    launch_ns: int = 0
    """DDP's launches of its buckets' all-reduces (the process group's calls, ``perf_counter_ns``); 0 where not
    measured."""
    others_ns: int = 0
    """Not the training thread's: the process's other threads' CPU time (gloo's, ``time.process_time_ns``), less
    the shim's threads'; 0 where not measured."""


@dataclass(frozen=True, slots=True)
class IterationBatch(Header):
    """All events of one rank for one iteration: one message per rank per iteration."""

    KIND: ClassVar[str] = "iter"
    WHEN: ClassVar[str] = "when `optimizer.step()` returns: all events of that iteration on this rank"

    iteration: int = field(metadata=wire(Int(), "the iteration, counted from 0 on each rank", key="it"))
    events: Sequence[Event] = field(metadata=wire(COLUMNS, "the iteration's tasks, not sorted", key="ev"))
    """Decoded frames carry :class:`EventColumns`; any sequence of events encodes."""
    dropped: int = field(metadata=DROPPED)
    dropped_queue: int = field(default=0, metadata=DROPPED_QUEUE)
    sender: int = field(default=0, metadata=SENDER)
    cpu_ns: int = field(default=0, metadata=wire(AddedInt(), "the training thread's CPU time over this iteration, "
                                                             "from the previous one's end (`time.thread_time_ns`): "
                                                             "what the advisor prices a step without its "
                                                             "all-reduces from; CPU ranks only, 0 where not measured"))
    update_cpu_ns: int = field(default=0, metadata=wire(AddedInt(), "of `cpu_ns`, the optimizer's step; 0 where "
                                                                    "not measured"))
    load_cpu_ns: int = field(default=0, metadata=wire(AddedInt(), "of `cpu_ns`, the loader's `next()` "
                                                                  "(`tracer.loader`); 0 where not measured"))
    shim_ns: int = field(default=0, metadata=wire(AddedInt(), "of the iteration, the shim's own time in its hooks "
                                                              "on the training thread (`time.perf_counter_ns`), "
                                                              "which the advisor takes out of its predictions; CPU "
                                                              "ranks only, 0 where not measured"))
    launch_ns: int = field(default=0, metadata=wire(AddedInt(), "of the iteration, the training thread's time in "
                                                                "the process group's all-reduce calls DDP launches "
                                                                "its buckets with (`time.perf_counter_ns`), which "
                                                                "regrouping the buckets or `no_sync` changes; CPU "
                                                                "ranks only, 0 where not measured"))
    others_cpu_ns: int = field(default=0, metadata=wire(AddedInt(), "beside `cpu_ns`, the process's other "
                                                                    "threads' CPU time over the iteration (gloo's; "
                                                                    "`time.process_time_ns`), less the shim's own "
                                                                    "threads': what the advisor weighs the "
                                                                    "all-reduces' CPU work by; CPU ranks only, 0 "
                                                                    "where not measured"))

    @property
    def thread_cpu(self) -> ThreadCpu | None:
        """The training thread's CPU times, where the rank measured them."""
        return (ThreadCpu(self.cpu_ns, self.update_cpu_ns, self.load_cpu_ns, self.shim_ns, self.launch_ns,
                          self.others_cpu_ns)
                if self.cpu_ns
                else None)


@dataclass(frozen=True, slots=True)
class Buckets(Header):
    """The bucket to parameters map of one rank, sent when first known and again whenever DDP rebuilds its buckets."""

    KIND: ClassVar[str] = "buckets"
    WHEN: ClassVar[str] = "after iteration 1; again when DDP rebuilds its buckets, and after every hello"

    buckets: tuple[Bucket, ...] = field(metadata=wire(BucketList(), "per bucket index: its bytes and its "
                                                                    "parameters' names, in bucket order"))
    sender: int = field(default=0, metadata=SENDER)
    parameter_bytes: tuple[tuple[int, ...], ...] = field(default=(), metadata=wire(
        AddedIntLists(), "per bucket, the bytes of each of its parameters, in the order of its names (what the "
                         "advisor regroups); empty where the names are, and from older ranks",
        key="param_bytes", check=_bytes_per_name))
    copy_ns: int = field(default=0, metadata=wire(AddedInt(), "ns a synced step of this rank spends in DDP's copies "
                                                              "of the gradients into these buckets and back, which "
                                                              "`no_sync` skips (timed once per bucket map, CPU "
                                                              "ranks only); 0 where not measured"))
    add_ns: int = field(default=0, metadata=wire(AddedInt(), "ns this rank takes to add a micro-batch's gradients "
                                                             "to those accumulated, which gradient accumulation "
                                                             "pays each micro-batch after the first (timed with "
                                                             "`copy_ns`); 0 where not measured"))


@dataclass(frozen=True, slots=True)
class Telemetry(Header):
    """One rank's sample of its host and its GPU, sent about every 2 s."""

    KIND: ClassVar[str] = "telemetry"
    WHEN: ClassVar[str] = "about 1 s after attach, then every 2 s: the rank's host and GPU"

    host: str = field(metadata=wire(Str(MAX_NAME_CHARS), "`socket.gethostname()`, as in `hello`"))
    local_rank: int = field(metadata=wire(Int(0, MAX_RANKS), "the rank's index on its host"))
    mono_ns: int = field(metadata=wire(Int(), "the rank's `perf_counter_ns()` when it sampled"))
    host_stats: HostStats | None = field(metadata=wire(
        Map(HostStats), "host-wide; only from local rank 0 of each host: one sender is enough", key="hw"))
    gpu: GpuStats | None = field(metadata=wire(
        Map(GpuStats), "the rank's own GPU; nil on a CPU rank, or when NVML is missing (`note` says why)"))
    note: str = field(default="", metadata=wire(
        Text(MAX_NOTE_CHARS), "why figures are missing, worded to follow the rank: `on CPU`, "
                              "`no GPU figures: NVML library not found`", after="mono_ns"))
    # `note` comes last here only because it has a default; on the wire it has always preceded hw and gpu.
    sender: int = field(default=0, metadata=SENDER)


@dataclass(frozen=True, slots=True)
class Heartbeat(Header):
    """Where a rank is now: the task it has open and for how long. A rank that stops sending these is silent."""

    KIND: ClassVar[str] = "heartbeat"
    WHEN: ClassVar[str] = "about every second, from the publisher thread: even while training is stuck"

    iteration: int = field(metadata=wire(Int(), "the iteration under way, counted from 0 on each rank", key="it"))
    task: str = field(metadata=wire(Text(MAX_NAME_CHARS), "the task open now (started, not ended): `all-reduce "
                                                          "bucket 7`, `forward layers.11`, `backward layers.3`, "
                                                          "`loader next`, `optimizer.step`; `after X` when none is "
                                                          "open and X ended last; `between iterations`; empty "
                                                          "before the first"))
    open_ms: int = field(metadata=wire(Int(), "milliseconds `task` has been open (for `after X`: since X ended)"))
    mono_ns: int = field(default=0, metadata=wire(AddedInt(), "the rank's `perf_counter_ns()` when it sent this: "
                                                              "the monitor judges a stall on the rank's clock, not "
                                                              "on when frames arrive; 0 from older ranks"))
    sender: int = field(default=0, metadata=SENDER)
    state: int = field(default=0, metadata=wire(AddedInt(hi=255), "what `task` is (`TaskState` in "
                                                 "instrument/events.py): 1 a task open, 2 a collective open (the "
                                                 "rank waits in it for the others), 3 none open (`after X`, "
                                                 "`between iterations`); 0 not said (older ranks, before the first "
                                                 "task); a monitor takes a value it does not know for 0", key="st"))


@dataclass(frozen=True, slots=True)
class Bye(Header):
    """A rank detaches cleanly."""

    KIND: ClassVar[str] = "bye"
    WHEN: ClassVar[str] = "on `tracer.close()` (also at interpreter exit)"

    iterations: int = field(metadata=wire(Int(), "iteration frames published"))
    dropped: int = field(metadata=DROPPED)
    dropped_queue: int = field(default=0, metadata=DROPPED_QUEUE)
    sender: int = field(default=0, metadata=SENDER)


Frame = Hello | IterationBatch | Buckets | Bye | Telemetry | Heartbeat

FRAMES: Final[tuple[type[Frame], ...]] = (Hello, IterationBatch, Buckets, Bye, Telemetry, Heartbeat)
"""Every kind of frame, in the order docs/wire.md lists them."""

_LAYOUT: Final[dict[type, Layout]] = {cls: layout_of(cls) for cls in FRAMES}
_BY_KIND: Final[dict[str, Layout]] = {cls.KIND: _LAYOUT[cls] for cls in FRAMES}
_ITER_V1: Final = Layout(IterationBatch, tuple(dataclasses.replace(f, type=EVENTS) if f.type is COLUMNS else f
                                               for f in _LAYOUT[IterationBatch].fields))
"""How version 1 laid out an ``iter`` frame: the same keys, the events as rows."""
_HEADER: Final = layout_of(Header).fields
"""``seq`` and ``rank``: every frame opens with them, after ``v`` and ``k``."""
_ITER: Final = _LAYOUT[IterationBatch]
# encode_iteration's keys, from the layout; unpacking fails at import if the frame gains or loses a field.
(_SEQ, _RANK, _IT, _EV, _DROPPED, _DROPPED_QUEUE, _SENDER, _CPU, _UPDATE_CPU, _LOAD_CPU, _SHIM, _LAUNCH,
 _OTHERS) = (
    f.key for f in _LAYOUT[IterationBatch])


def _pack(obj: dict[str, Any]) -> bytes:
    payload: bytes = msgpack.packb(obj, use_bin_type=True)
    return payload


def encode(frame: Frame) -> bytes:
    """Encode any frame."""
    layout = _LAYOUT.get(type(frame))
    if layout is None:
        raise TypeError(f"not a wire frame: {type(frame).__name__}")
    return _pack(layout.encode(frame, {"v": WIRE_VERSION, "k": frame.KIND}))


def encode_iteration(
    seq: int, rank: int, iteration: int, events: Sequence[Event] | list[tuple[Any, ...]], dropped: int,
    dropped_queue: int = 0, sender: int = 0, cpu: ThreadCpu | None = None,
) -> bytes:
    """Encode one rank's iteration; ``events`` may be plain 7-tuples (the shim's hot path), ``cpu`` the training
    thread's CPU times (:class:`ThreadCpu`) on a CPU rank.

    The same bytes as ``encode(IterationBatch(...))`` without building the frame (tests/test_wire_schema.py checks
    it): this runs once per iteration on every rank, with the keys taken from the layout.
    """
    m = {"v": WIRE_VERSION, "k": IterationBatch.KIND, _SEQ: seq, _RANK: rank, _IT: iteration,
         _EV: COLUMNS.encode(events), _DROPPED: dropped}
    if dropped_queue:
        m[_DROPPED_QUEUE] = dropped_queue
    if sender:
        m[_SENDER] = sender
    if cpu is not None:
        for key, ns in zip((_CPU, _UPDATE_CPU, _LOAD_CPU, _SHIM, _LAUNCH, _OTHERS), cpu):
            if ns:
                m[key] = ns
    return _pack(m)


_MAP_MARKERS: Final = frozenset(bytes([b]) for b in (*range(0x80, 0x90), 0xDE, 0xDF))
"""First bytes of a msgpack map (fixmap, map16, map32): what every frame is."""


def decode(payload: bytes) -> Frame:
    """Decode and validate one frame.

    Raises:
        WireError: with a reason, for anything that is not a well-formed frame of this version.
    """
    if len(payload) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    if payload[:1] not in _MAP_MARKERS:  # refused before msgpack builds whatever it is
        raise WireError(f"not msgpack, or not a map: a frame must be a map (this one starts with 0x{payload[0]:02x})"
                        if payload else "not msgpack: an empty message")
    try:
        # bin: version 2's event columns, each bounded by the frame's size; ext: never.
        m = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=MAX_FRAME_BYTES, max_ext_len=0,
                            max_str_len=MAX_STRING_BYTES, max_map_len=MAX_MAP_KEYS,
                            max_array_len=MAX_EVENTS_PER_FRAME)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types for bad input
        raise WireError(f"not msgpack: {str(exc) or type(exc).__name__}") from None  # StackError: nested too deep
    version = m.get("v")  # a map: its first byte says so, and msgpack refuses anything after its end
    if version not in READ_VERSIONS or type(version) is not int:
        raise WireError(f"wire version {version!r} is not supported (this monitor reads versions "
                        f"{', '.join(map(str, READ_VERSIONS))})")
    kind = m.get("k")
    layout = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if layout is None:
        for f in _HEADER:  # a bad seq or rank is the reason given first, whatever the kind
            f.type.decode(m.get(f.key, f.type.absent), f.key, "")
        raise WireError(f"unknown frame kind {kind!r}")
    if version == 1 and layout is _ITER:
        layout = _ITER_V1
    frame: Frame = layout.decode(m)
    return frame
