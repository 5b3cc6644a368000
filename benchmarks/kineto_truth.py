"""The profiler's side of the GPU checks: GPU work per block, per iteration and per copy, read from a Kineto trace.

Independent of dagtop's timing code. Blocks are marked by record_function ranges that the checks' own forward
hooks open (``truth:fwd:NAME``) and iterations by ``truth:iter#N``. A kernel belongs to the block whose
forward range launched it; in backward, to the block whose forward op has the autograd node's sequence number
(Kineto's "Sequence number" links ``evaluate_function: XBackward0`` to the forward op that built X).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
              "cuCtxSynchronize", "cuEventSynchronize")


class TruthHooks:
    """Forward hooks that open ``truth:fwd:NAME`` ranges around each unit: what the profiler attributes by."""

    def __init__(self, units: list[tuple[str, torch.nn.Module]]) -> None:
        self._open: dict[int, Any] = {}
        self._handles = []
        for name, module in units:
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post()))

    def _pre(self, name: str) -> Any:
        def pre(module: torch.nn.Module, args: Any) -> None:
            if torch.is_grad_enabled():
                rf = torch.autograd.profiler.record_function(f"truth:fwd:{name}")
                rf.__enter__()
                self._open[id(module)] = rf
        return pre

    def _post(self) -> Any:
        def post(module: torch.nn.Module, args: Any, output: Any) -> None:
            rf = self._open.pop(id(module), None)
            if rf is not None:
                rf.__exit__(None, None, None)
        return post

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@contextlib.contextmanager
def iteration(i: int) -> Iterator[None]:
    with torch.autograd.profiler.record_function(f"truth:iter#{i}"):
        yield


@dataclass
class Span:
    start: float = float("inf")
    end: float = float("-inf")
    busy: float = 0.0
    """Summed duration of the GPU operations, µs."""
    count: int = 0

    def add(self, ts: float, dur: float) -> None:
        self.start, self.end = min(self.start, ts), max(self.end, ts + dur)
        self.busy += dur
        self.count += 1


@dataclass
class TraceTruth:
    """What the trace says, in µs of the profiler's clock."""

    blocks: dict[tuple[int, str, str], Span] = field(default_factory=dict)
    """(iteration, block, "forward"|"backward") -> its GPU operations."""
    iteration_gpu_end: dict[int, float] = field(default_factory=dict)
    """Iteration -> end of the last GPU operation launched during it."""
    memcpy: list[dict[str, Any]] = field(default_factory=list)
    """Host-to-device copies: ts, dur, bytes, name, iteration."""
    nccl: list[dict[str, Any]] = field(default_factory=list)
    """Collective kernels: ts, dur, name, iteration."""
    collectives: list[dict[str, Any]] = field(default_factory=list)
    """Each all-reduce call (``c10d::allreduce_``): iteration, and the end of the GPU work it launched, or, where
    it launched none (NCCL with one rank reduces nothing), of the last GPU op launched before it (the hook's
    division of the bucket)."""
    syncs: collections.Counter[str] = field(default_factory=collections.Counter)
    gpu_ops: list[dict[str, Any]] = field(default_factory=list)


def _contains(ranges: list[tuple[float, float, Any]], starts: list[float], ts: float) -> Any:
    """The payload of the range holding ``ts``, or None (``ranges`` sorted by start, never nested)."""
    i = bisect.bisect_right(starts, ts) - 1
    if i >= 0 and ranges[i][1] >= ts:
        return ranges[i][2]
    return None


def read(path: str) -> TraceTruth:
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    truth = TraceTruth()
    iters: list[tuple[float, float, int]] = []
    fwd: dict[int, list[tuple[float, float, str]]] = collections.defaultdict(list)  # tid -> block ranges
    bwd: dict[int, list[tuple[float, float, int]]] = collections.defaultdict(list)  # tid -> (evaluate_function, seq)
    ops: list[dict[str, Any]] = []
    comm_calls: list[dict[str, Any]] = []
    launches: dict[int, dict[str, Any]] = {}
    gpu: list[dict[str, Any]] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name", "")
        if cat == "user_annotation":
            if name.startswith("truth:iter#"):
                iters.append((e["ts"], e["ts"] + e["dur"], int(name.split("#")[1])))
            elif name.startswith("truth:fwd:"):
                fwd[e["tid"]].append((e["ts"], e["ts"] + e["dur"], name[len("truth:fwd:"):]))
        elif cat == "cpu_op":
            seq = e.get("args", {}).get("Sequence number")
            if name.startswith("autograd::engine::evaluate_function:") and seq is not None:
                bwd[e["tid"]].append((e["ts"], e["ts"] + e["dur"], seq))
            elif seq is not None:
                ops.append(e)
            if name == "c10d::allreduce_":
                comm_calls.append(e)
        elif cat in LAUNCH_CATS:
            if any(name.startswith(s) for s in SYNC_CALLS):
                truth.syncs[name] += 1
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                launches[corr] = e
        elif cat in GPU_CATS:
            gpu.append(e)
    iters.sort()
    iter_starts = [r[0] for r in iters]
    for ranges in (*fwd.values(), *bwd.values()):
        ranges.sort()
    # Sequence number -> block: every forward op inside a block's range.
    seq_block: dict[int, str] = {}
    fwd_starts = {tid: [r[0] for r in rs] for tid, rs in fwd.items()}
    for op in ops:
        rs = fwd.get(op["tid"])
        if rs:
            block = _contains(rs, fwd_starts[op["tid"]], op["ts"])
            if block is not None:
                seq_block.setdefault(op["args"]["Sequence number"], block)
    bwd_starts = {tid: [r[0] for r in rs] for tid, rs in bwd.items()}
    for g in gpu:
        launch = launches.get(g.get("args", {}).get("correlation"))
        if launch is None:
            continue
        it = _contains(iters, iter_starts, launch["ts"])
        ts, dur = g["ts"], g.get("dur", 0)
        record = {"ts": ts, "dur": dur, "name": g.get("name", ""), "iteration": it, "cat": g["cat"],
                  "bytes": g.get("args", {}).get("bytes"), "launch_tid": launch["tid"], "launch_ts": launch["ts"],
                  "stream": g.get("args", {}).get("stream")}
        truth.gpu_ops.append(record)
        if g["cat"] == "gpu_memcpy" and "HtoD" in record["name"]:
            truth.memcpy.append(record)
        if re.match(r"nccl(Dev)?Kernel", record["name"]):
            truth.nccl.append(record)
        if it is None:
            continue
        truth.iteration_gpu_end[it] = max(truth.iteration_gpu_end.get(it, float("-inf")), ts + dur)
        tid = launch["tid"]
        block = _contains(fwd[tid], fwd_starts[tid], launch["ts"]) if tid in fwd else None
        if block is not None:
            truth.blocks.setdefault((it, block, "forward"), Span()).add(ts, dur)
            continue
        seq = _contains(bwd[tid], bwd_starts[tid], launch["ts"]) if tid in bwd else None
        if seq is not None and seq in seq_block:
            truth.blocks.setdefault((it, seq_block[seq], "backward"), Span()).add(ts, dur)
    by_tid: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for op in truth.gpu_ops:
        launch_ts = op.get("launch_ts")
        if launch_ts is not None:
            by_tid[op["launch_tid"]].append(op)
    for ops_of in by_tid.values():
        ops_of.sort(key=lambda o: o["launch_ts"])
    for call in sorted(comm_calls, key=lambda c: c["ts"]):
        launched = by_tid.get(call["tid"], [])
        inside = [o for o in launched if call["ts"] <= o["launch_ts"] <= call["ts"] + call["dur"]]
        before = [o for o in launched if o["launch_ts"] < call["ts"]]
        work = inside or before[-1:]
        if work:
            truth.collectives.append({"iteration": _contains(iters, iter_starts, call["ts"]),
                                      "end": max(o["ts"] + o["dur"] for o in work),
                                      "op": work[-1]["name"], "own_gpu_work": bool(inside)})
    return truth
