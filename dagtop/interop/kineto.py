"""Read one rank's PyTorch-profiler (Kineto) trace, streamed: only the events dagtop turns into tasks are kept.

A trace is a JSON object (``.json`` or ``.json.gz``) with ``distributedInfo`` (rank, world size, process groups),
``host_name``, ``baseTimeNanoseconds`` and ``traceEvents``, a list of Chrome trace events with ``ts``/``dur`` in
microseconds. It is read with ijson one event at a time, so a trace of gigabytes never sits in memory whole: what
is kept is a compact :class:`Span` per event of interest (steps, the labels of the dataloader and the optimizer,
``nn.Module`` annotations, autograd-recorded operators, collectives, GPU kernels and the launches that link them).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import ijson

STEP_PREFIX = "ProfilerStep#"
LOADER_PREFIX = "enumerate(DataLoader)#"
OPTIMIZER_PREFIX = "Optimizer.step#"
MODULE_PREFIX = "nn.Module: "
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
COMMS = "record_param_comms"
NCCL_KERNELS = ("ncclDevKernel_", "ncclKernel_")
KINDS = ("step", "loader", "optimizer", "module", "op", "annotation", "c10d", "comms", "backend")
"""What a kept CPU span is: ``op`` an operator autograd numbered (forward) or an autograd function (backward),
``annotation`` any other ``record_function`` label, ``c10d`` a collective operator, ``comms`` its
``record_param_comms``, ``backend`` the collective as its backend's thread ran it (``gloo:all_reduce``)."""


class TraceError(ValueError):
    """A file that cannot be read as a profiler trace: the message is one line, naming the file."""


class Span(NamedTuple):
    """One kept CPU event, in nanoseconds on the trace's clock."""

    start: int
    end: int
    name: str
    tid: int
    kind: str
    seq: int = -1
    """autograd's sequence number (``Sequence number``), the one thing tying a backward function to its forward
    operator; -1 if none."""
    args: tuple[tuple[str, Any], ...] = ()
    """For ``comms``: its arguments (collective name, sizes, process group, sequence number); for ``c10d``: its
    input's shape and type (``record_shapes=True``)."""


class Kernel(NamedTuple):
    """One GPU activity (kernel or memcpy), in nanoseconds on the trace's clock."""

    start: int
    end: int
    stream: int
    correlation: int
    name: str
    kind: str
    """``kernel``, ``memcpy`` (host to device) or ``nccl``."""
    key: tuple[str, int] | None = None
    """An NCCL kernel's (process group, sequence number), where Kineto copied them onto the kernel."""


@dataclass
class RankTrace:
    """What dagtop keeps of one rank's trace."""

    path: Path
    rank: int | None
    world: int | None
    host: str
    base_ns: int
    """``baseTimeNanoseconds``: a span's ``start`` plus this is the time since the epoch."""
    backend: str = ""
    spans: list[Span] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    launches: list[tuple[int, int, int]] = field(default_factory=list)
    """GPU launches on the CPU: (tid, ts ns, correlation)."""
    pid: int = 0


_COMMS_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
               "Process Group Description", "Seq", "pg_name", "pg_id")
_SHAPE_ARGS = ("Input Dims", "Input type")


@contextmanager
def _open(path: Path) -> Iterator[io.BufferedIOBase]:
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if gzipped:
            with gzip.GzipFile(fileobj=raw) as f:
                yield f
        else:
            yield raw


def _ns(us: Any) -> int:
    return round(float(us) * 1000.0)


def _tid(value: Any) -> int:
    return value if isinstance(value, int) else hash(value) & 0xFFFFFFFF


def _cpu_kind(name: str, cat: str, args: dict[str, Any]) -> tuple[str, int] | None:
    """The kind of a CPU event dagtop keeps and its sequence number, or None to drop it."""
    if cat == "python_function":
        return ("module", -1) if name.startswith(MODULE_PREFIX) else None
    if name.startswith(STEP_PREFIX):
        return "step", -1
    if name.startswith(LOADER_PREFIX):
        return "loader", -1
    if name.startswith(OPTIMIZER_PREFIX):
        return "optimizer", -1
    if name == COMMS:
        return "comms", -1
    if name.startswith("c10d::"):
        return "c10d", -1
    if name.startswith(("gloo:", "nccl:", "mpi:", "ucc:")):
        return "backend", -1
    seq = args.get("Sequence number")
    if name.startswith(BACKWARD_PREFIX):
        return "op", seq if isinstance(seq, int) else -1
    if isinstance(seq, int):
        return "op", seq
    if cat == "user_annotation":
        return "annotation", -1
    return None


def _fold(trace: RankTrace, e: dict[str, Any]) -> None:
    """Keep what dagtop needs of one trace event."""
    if e.get("ph") != "X" or "ts" not in e:
        return
    cat, name = e.get("cat", ""), e.get("name", "")
    if not isinstance(cat, str) or not isinstance(name, str):
        return
    start = _ns(e["ts"])
    end = start + max(0, _ns(e.get("dur", 0)))
    args = e.get("args") or {}
    if not isinstance(args, dict):
        args = {}
    if cat in ("kernel", "gpu_memcpy"):
        kind = "nccl" if name.startswith(NCCL_KERNELS) else "memcpy" if cat == "gpu_memcpy" else "kernel"
        if kind == "memcpy" and "HtoD" not in name:
            return
        key = None
        if kind == "nccl" and isinstance(args.get("Seq"), int):  # newer Kineto copies them from the collective
            key = (str(args.get("Process Group Name", "")), args["Seq"])
        trace.kernels.append(Kernel(start, end, _tid(e.get("tid", 0)), int(args.get("correlation", -1)),
                                    name if kind == "nccl" else "", kind, key))
        return
    if cat in ("cuda_runtime", "cuda_driver"):
        if "correlation" in args and ("Launch" in name or "Memcpy" in name):
            trace.launches.append((_tid(e.get("tid", 0)), start, int(args.get("correlation", -1))))
        return
    if cat not in ("cpu_op", "user_annotation", "python_function"):
        return
    kept = _cpu_kind(name, cat, args)
    if kept is None:
        return
    kind, seq = kept
    if kind == "module":
        name = name[len(MODULE_PREFIX):]
    wanted = _COMMS_ARGS if kind == "comms" else _SHAPE_ARGS if kind == "c10d" else ()
    comms = tuple((k, args[k]) for k in wanted if k in args)
    trace.spans.append(Span(start, end, name, _tid(e.get("tid", 0)), kind, seq, comms))
    if kind == "step" and not trace.pid:
        pid = e.get("pid")
        trace.pid = pid if isinstance(pid, int) and pid >= 0 else 0


def _header(path: Path) -> dict[str, Any]:
    """The trace's top-level keys other than ``traceEvents`` (Kineto writes them first): parsed up to the events,
    then, for ``distributedInfo`` only, searched in the rest of the file."""
    found: dict[str, Any] = {}
    with _open(path) as f:
        builder: Any = None
        for prefix, event, value in ijson.parse(f, use_float=True):
            if prefix == "" and event == "map_key":
                if value == "traceEvents":
                    break
                continue
            top, _, _ = prefix.partition(".")
            if top == "distributedInfo":
                if builder is None:
                    builder = ijson.ObjectBuilder()
                builder.event(event, value)
                if prefix == "distributedInfo" and event == "end_map":
                    found["distributedInfo"] = builder.value
            elif prefix in ("host_name", "baseTimeNanoseconds", "schemaVersion") and event in ("string", "number"):
                found[prefix] = value
    if "distributedInfo" not in found:
        with _open(path) as f:
            found["distributedInfo"] = next(iter(ijson.items(f, "distributedInfo", use_float=True)), None)
    return found


def read_trace(path: str | Path) -> RankTrace:
    """Stream one rank's trace into a :class:`RankTrace`.

    Raises:
        TraceError: the file is missing, not JSON, cut short (also a cut gzip stream), or holds no events.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: {'is a directory, not a trace' if path.is_dir() else 'no such file'}")
    try:
        header = _header(path)
        info = header.get("distributedInfo")
        info = info if isinstance(info, dict) else {}
        rank, world = info.get("rank"), info.get("world_size")
        base = header.get("baseTimeNanoseconds", 0)
        trace = RankTrace(path, rank if isinstance(rank, int) else None, world if isinstance(world, int) else None,
                          str(header.get("host_name") or "imported")[:256],
                          int(base) if isinstance(base, (int, float)) else 0, str(info.get("backend", "")))
        events = 0
        with _open(path) as f:
            for e in ijson.items(f, "traceEvents.item", use_float=True):
                events += 1
                if isinstance(e, dict):
                    _fold(trace, e)
    except ijson.IncompleteJSONError as exc:
        raise TraceError(f"{path}: the trace is cut short or not JSON ({_first_line(exc)})") from None
    except ijson.JSONError as exc:
        raise TraceError(f"{path}: not a JSON profiler trace ({_first_line(exc)})") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{path}: the gzip stream is cut short or corrupt ({_first_line(exc)})") from None
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise TraceError(f"{path}: not a profiler trace ({_first_line(exc)})") from None
    if events == 0:
        raise TraceError(f"{path}: no trace events (is it a PyTorch-profiler trace, from export_chrome_trace?)")
    return trace


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]
