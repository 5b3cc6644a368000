"""One rank's profiler trace cut into iterations of wire events: the tasks the shim would have timed.

Per ``ProfilerStep#N`` (iteration N) on the thread that ran the steps:

- ``enumerate(DataLoader)#…`` → io ``next``; ``Optimizer.step#…`` → the update ``optimizer.step``.
- Forward per unit. With ``nn.Module`` annotations (``with_stack=True``) the units are the top-level modules, found
  as the shim finds its blocks: from each outermost module, down while a module has exactly one child, then its
  children (all of them: a trace does not say which hold parameters, where the shim leaves out the leaves without
  any, an activation between layers). Without them, an operator group: each top-level ``record_function`` label of the forward, and each run
  of top-level operators between them, named after its first operator.
- Backward per unit: autograd's functions (``autograd::engine::evaluate_function: …``) carry the sequence number
  of the forward operator that recorded them, so each one is the unit's whose forward ran that operator
  (``AccumulateGrad``, without a number, the unit before it); consecutive functions of one unit are one task.
- Collectives: ``record_param_comms`` where the trace has it (its process group and sequence number, sizes), else
  each ``c10d::`` operator; the span runs from the issue on the CPU to the end on the backend's thread
  (``gloo:all_reduce``), or is the NCCL kernel's (``ncclDevKernel_*``, ``ncclKernel_*``) when there is one.
- With GPU kernels, a task's compute is the span of the kernels its CPU stretch launched (lane ``gpu``), and
  host-to-device copies are ``to_device`` on lane ``copy``.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dagtop.interop.kineto import BACKWARD_PREFIX, STEP_PREFIX, Kernel, RankTrace, Span
from instrument.events import BACKWARD, COPY, FORWARD, LOAD, UPDATE, Event

_COMPUTE = {kind.phase: kind for kind in (FORWARD, BACKWARD, UPDATE)}
"""The compute kinds by phase, as the trace's spans are told apart."""

DTYPE_BYTES = {"Float": 4, "float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1,
               "Char": 1, "Bool": 1, "Short": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
"""Bytes per element of ``record_param_comms``'s ``dtype``."""
_SUFFIXES = ("coalesced", "tensor", "base", "into")


@dataclass(frozen=True)
class CollectiveSpan:
    """One rank's collective, before it is named: matched across ranks by ``key`` where the trace gives one
    (process group, sequence number), else by its ``order`` among the rank's collectives of the iteration."""

    iteration: int
    kind: str
    start: int
    end: int
    bytes: int
    key: tuple[str, int] | None
    order: int


@dataclass
class RankIterations:
    """A rank's trace as dagtop's tasks: per iteration its events, collectives apart until they are named."""

    trace: RankTrace
    events: dict[int, list[Event]] = field(default_factory=dict)
    collectives: list[CollectiveSpan] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    """The units found, in the order they first ran."""
    by_module: bool = False
    gpu: bool = False


def collective_kind(name: str) -> str:
    """``c10d::allreduce_``, ``gloo:all_reduce``, ``allreduce`` → ``allreduce``: one word per collective."""
    word = re.sub(r"[^a-z]", "", name.rsplit(":", 1)[-1].lower())
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if word.endswith(suffix) and len(word) > len(suffix):
                word, changed = word[: -len(suffix)], True
    return word or "collective"


def _nest(spans: Sequence[Span]) -> list[int]:
    """Each span's parent index in ``spans`` (sorted by start, longest first), -1 at the top, by containment."""
    parents: list[int] = []
    stack: list[int] = []
    for i, s in enumerate(spans):
        while stack and spans[stack[-1]].end <= s.start:
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        stack.append(i)
    return parents


def _module_units(mods: Sequence[Span]) -> list[Span]:
    """The top-level modules: from each outermost one, down while a module has exactly one child."""
    parents = _nest(mods)
    children: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(parents):
        children[p].append(i)
    units = []
    for root in children[-1]:
        node = root
        while len(children[node]) == 1:
            node = children[node][0]
        units.extend([mods[c] for c in children[node]] or [mods[node]])
    return units


def _operator_units(top: Sequence[Span], lo: int, hi: int) -> list[Span]:
    """Operator groups of the forward in ``[lo, hi)``: each label alone, each run of operators as one."""
    units: list[Span] = []
    run: list[Span] = []
    for s in top:
        if s.start < lo or s.start >= hi or s.name.startswith("Optimizer."):
            continue
        if s.kind == "annotation":
            if run:
                units.append(run[0]._replace(end=run[-1].end))
                run = []
            units.append(s)
        elif s.kind == "op" and not s.name.startswith(BACKWARD_PREFIX):
            run.append(s)
    if run:
        units.append(run[0]._replace(end=run[-1].end))
    return units


class _Gpu:
    """The GPU side of a rank: which kernels a CPU stretch launched."""

    def __init__(self, trace: RankTrace) -> None:
        by_corr = {k.correlation: k for k in trace.kernels if k.correlation >= 0}
        self.launches: dict[int, tuple[list[int], list[Kernel | None]]] = {}
        for tid, ts, corr in sorted(trace.launches):
            times, kernels = self.launches.setdefault(tid, ([], []))
            times.append(ts)
            kernels.append(by_corr.get(corr))
        self.by_key = {k.key: k for k in trace.kernels if k.key is not None}
        self.has_compute = any(k.kind == "kernel" for k in trace.kernels)

    def launched(self, tid: int, start: int, end: int, kinds: tuple[str, ...]) -> list[Kernel]:
        times, kernels = self.launches.get(tid, ([], []))
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        return [k for k in kernels[lo:hi] if k is not None and k.kind in kinds]


def _main_tid(steps: Sequence[Span]) -> int:
    return Counter(s.tid for s in steps).most_common(1)[0][0]


def _step_number(name: str) -> int | None:
    digits = name[len(STEP_PREFIX):]
    return int(digits) if digits.isdigit() else None


def lift(trace: RankTrace) -> RankIterations:
    """Cut a rank's trace into iterations of events (collectives kept apart, unnamed)."""
    out = RankIterations(trace)
    spans = sorted(trace.spans, key=lambda s: (s.start, -s.end))
    steps = [s for s in spans if s.kind == "step" and _step_number(s.name) is not None]
    if not steps:
        return out
    main = _main_tid(steps)
    steps = [s for s in steps if s.tid == main]
    gpu = _Gpu(trace)
    out.gpu = gpu.has_compute
    out.by_module = any(s.kind == "module" for s in spans)
    starts = [s.start for s in spans]
    backend = [s for s in spans if s.kind == "backend"]
    matched_backend = _match_backend([s for s in spans if s.kind == "c10d"], backend)
    seen_units: dict[str, None] = {}
    for step in steps:
        it = _step_number(step.name)
        assert it is not None
        lo, hi = bisect.bisect_left(starts, step.start), bisect.bisect_left(starts, step.end)
        window = spans[lo:hi]
        on_main = [s for s in window if s.tid == main and s is not step]
        events: list[Event] = []
        for s in on_main:
            if s.kind == "loader":
                events.append(Event(*LOAD, "next", "main", s.start, s.end))
        backward = [s for s in window if s.kind == "op" and s.name.startswith(BACKWARD_PREFIX)]
        first_backward = min((s.start for s in backward), default=step.end)
        loads = [s.end for s in on_main if s.kind == "loader"]
        if out.by_module:
            units = _module_units([s for s in on_main if s.kind == "module"])
        else:
            parents = _nest(on_main)
            top = [s for s, p in zip(on_main, parents) if p == -1]
            units = _operator_units(top, max(loads, default=step.start), first_backward)
        unit_of_seq = _unit_of_seq(on_main, units)
        compute: list[tuple[str, str, int, int, int]] = [("forward", u.name, u.tid, u.start, u.end) for u in units]
        for u in units:
            seen_units.setdefault(u.name, None)
        label: str | None = None
        for s in backward:
            label = unit_of_seq.get(s.seq, None) if s.seq >= 0 else label
            if label is None:
                continue
            last = compute[-1] if compute else None
            if last and last[0] == "backward" and last[1] == label and last[2] == s.tid:
                compute[-1] = (*last[:4], max(last[4], s.end))
            else:
                compute.append(("backward", label, s.tid, s.start, s.end))
        for s in on_main:
            if s.kind == "optimizer":
                compute.append(("update", "optimizer.step", s.tid, s.start, s.end))
        events.extend(_compute_events(compute, gpu))
        if gpu.has_compute:
            copies = [k for k in trace.kernels if k.kind == "memcpy" and step.start <= k.start < step.end]
            events.extend(Event(*COPY, "to_device", "copy", k.start, k.end) for k in copies)
        out.events[it] = _no_overlap(events)
        out.collectives.extend(_collectives(it, window, gpu, matched_backend))
    out.units = list(seen_units)
    return out


def _unit_of_seq(on_main: Sequence[Span], units: Sequence[Span]) -> dict[int, str]:
    """Sequence number → the unit whose forward ran the operator that autograd numbered so."""
    found: dict[int, str] = {}
    ordered = sorted(units, key=lambda u: u.start)
    unit_starts = [u.start for u in ordered]
    for s in on_main:
        if s.kind != "op" or s.seq < 0 or s.name.startswith(BACKWARD_PREFIX) or s.seq in found:
            continue
        i = bisect.bisect_right(unit_starts, s.start) - 1
        if i >= 0 and s.end <= ordered[i].end:
            found[s.seq] = ordered[i].name
    return found


def _compute_events(compute: list[tuple[str, str, int, int, int]], gpu: _Gpu) -> list[Event]:
    """The compute tasks on the CPU, or on the GPU where they launched kernels."""
    events = []
    for phase, name, tid, start, end in compute:
        lane = "main"
        if gpu.has_compute:
            kernels = gpu.launched(tid, start, end, ("kernel",))
            if kernels:
                lane, start, end = "gpu", min(k.start for k in kernels), max(k.end for k in kernels)
        events.append(Event(*_COMPUTE[phase], name[:256], lane, start, end))
    return events


def _no_overlap(events: list[Event]) -> list[Event]:
    """Tasks on one lane never overlap (docs/wire.md): a task starting inside the one before starts at its end."""
    out: list[Event] = []
    last_end: dict[str, int] = {}
    for e in sorted(events, key=lambda e: (e.start_ns, e.end_ns)):
        start = max(e.start_ns, last_end.get(e.lane, e.start_ns))
        if start >= e.end_ns and e.end_ns > e.start_ns:
            continue
        out.append(e._replace(start_ns=start, end_ns=max(start, e.end_ns)))
        last_end[e.lane] = max(start, e.end_ns)
    return out


def _match_backend(c10d: Sequence[Span], backend: Sequence[Span]) -> dict[int, Span]:
    """Each ``c10d::`` operator's run on the backend's threads (``gloo:all_reduce``): the first unmatched one of the
    same collective that started after it. Backends run a process group's work in the order it was issued."""
    pending: dict[str, list[Span]] = defaultdict(list)
    for b in sorted(backend, key=lambda s: s.start):
        pending[collective_kind(b.name)].append(b)
    taken: dict[str, int] = defaultdict(int)
    found: dict[int, Span] = {}
    """id() of the operator → its run (a span holding its shapes is not hashable)."""
    outer = [s for s, p in zip(c10d, _nest(c10d)) if p == -1]
    for op in outer:
        kind = collective_kind(op.name)
        queue, i = pending[kind], taken[kind]
        while i < len(queue) and queue[i].start < op.start:
            i += 1
        if i < len(queue):
            found[id(op)] = queue[i]
            i += 1
        taken[kind] = i
    return found


def _collectives(it: int, window: Sequence[Span], gpu: _Gpu, backend: dict[int, Span]) -> list[CollectiveSpan]:
    comms = [s for s in window if s.kind == "comms"]
    out = []
    if comms:
        for order, s in enumerate(comms):  # named by process group and sequence number: order is a fallback
            args: dict[str, Any] = dict(s.args)
            kind = collective_kind(str(args.get("Collective name", "collective")))
            seq = args.get("Seq")
            key = (str(args.get("Process Group Name", args.get("pg_name", ""))), seq) if isinstance(seq, int) else None
            nelems = args.get("In msg nelems", 0)
            size = (nelems if isinstance(nelems, int) else 0) * DTYPE_BYTES.get(str(args.get("dtype", "")), 0)
            start, end = s.start, s.end
            kernels = gpu.launched(s.tid, s.start, s.end, ("nccl",)) or ([gpu.by_key[key]] if key in gpu.by_key else [])
            if kernels:
                start, end = min(k.start for k in kernels), max(k.end for k in kernels)
            out.append(CollectiveSpan(it, kind, start, end, size, key, order))
        return out
    c10d = [s for s in window if s.kind == "c10d"]
    orders: Counter[str] = Counter()
    for s in (s for s, p in zip(c10d, _nest(c10d)) if p == -1):
        run = backend.get(id(s))
        end = max(s.end, run.end) if run is not None else s.end
        kind = collective_kind(s.name)
        out.append(CollectiveSpan(it, kind, s.start, end, _shape_bytes(dict(s.args)), None, orders[kind]))
        orders[kind] += 1
    return out


def _shape_bytes(args: dict[str, Any]) -> int:
    """A collective operator's first tensor's bytes, from ``record_shapes=True``'s Input Dims and Input type. A
    ``TensorList`` says no element type: taken as 4 bytes, float32 gradients (with bf16 ones the sizes read twice
    too large, which leaves the what-ifs unchanged: the α-β fit scales β to match)."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    while isinstance(types, list) and types:
        types = types[0]
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims) or not isinstance(types, str):
        return 0
    n = 1
    for d in dims:
        n *= d
    return n * DTYPE_BYTES.get(types, 4 if types == "TensorList" else 0)
