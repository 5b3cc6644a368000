"""Collectives the training script calls itself (``dist.all_reduce(loss)``, ``dist.barrier()``), timed as
communication tasks that join the cross-rank DAG, named by op: ``all_reduce (script)``.

Under DDP or FSDP, :func:`instrument.attach` swaps the functions of ``torch.distributed`` that a script calls by
hand (:data:`OPS`) for wrappers: a call from outside torch is stamped when issued (ready) and when it is over on
this rank (done: when the call returns; with ``async_op=True``, when its work's future completes), and recorded
as ``("allreduce", "allreduce", "<op> (script)", "comm", ready, done, bytes)``. The monitor matches the n-th call of
one op in an iteration across ranks (`` #2`` from the second on; a process group smaller than the job adds its
ranks), as it matches DDP's buckets, and makes the calling rank's training thread wait for it (dagtop/model/dag.py).

What is not timed twice: torch's own calls of these functions (FSDP's all-gathers and HSDP's all-reduce, DDP's
join), which dagtop times where they are issued or not at all, are told by the caller's module (``torch.…``) and
passed straight through; DDP's bucket all-reduces and buffer broadcasts never come this way (the reducer calls its
process group in C++). A call inside a region Dynamo compiles is passed through too. Nothing else changes: the
wrapper calls the function it replaced with the same arguments, so results are bit-identical; the cost is one
frame look-up and two stamps per call, on those calls only. A script that bound a function before attach
(``from torch.distributed import all_reduce``) keeps the unwrapped one: those calls stay untimed.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import torch
import torch.distributed as dist

from instrument.events import COLLECTIVE, SCRIPT
from instrument.fsdp import _Names as Names
from instrument.probe import Probe

OPS: Final = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "barrier", "reduce_scatter",
              "reduce_scatter_tensor")
"""The functions of ``torch.distributed`` timed when the script calls them."""
_TENSORS: Final = {"all_reduce": "tensor", "all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor",
                   "broadcast": "tensor", "reduce_scatter": "input_list", "reduce_scatter_tensor": "input"}
"""The argument whose bytes a collective counts: what it reduces or gathers in all (a barrier moves none)."""

_compiling = torch.compiler.is_compiling


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class ScriptCollectives:
    """The wrappers of :data:`OPS` for one tracer; :meth:`remove` puts the functions back."""

    def __init__(self, probe: Probe, iteration: Callable[[], int]) -> None:
        self._probe = probe
        """The tracer's, on the ``comm`` lane."""
        self._names = Names(iteration)
        self._open: dict[int, tuple[str, int]] = {}
        """Call number → (name, ``perf_counter_ns`` when issued), while the collective is in flight."""
        self._count = itertools.count()
        self._swapped: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        for op in OPS:
            original = getattr(dist, op, None)
            if original is None:
                continue
            wrapper = self._wrap(op, original)
            setattr(dist, op, wrapper)
            self._swapped[op] = (original, wrapper)

    def remove(self) -> None:
        """Give ``torch.distributed`` its functions back (those still ours: another tool may have wrapped ours)."""
        for op, (original, wrapper) in self._swapped.items():
            if getattr(dist, op, None) is wrapper:
                setattr(dist, op, original)
        self._swapped.clear()

    def in_flight(self) -> tuple[str, int] | None:
        """The oldest script collective issued and not done: its name and ``perf_counter_ns`` then; or None. Read from
        the publisher's thread (a look at a copy)."""
        try:
            return min(self._open.copy().values(), key=lambda item: item[1])
        except ValueError:
            return None

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(original).parameters)
        at = {name: params.index(name) for name in ("group", "async_op", _TENSORS.get(op, "")) if name in params}
        tensors = _TENSORS.get(op)
        base = f"{op}{SCRIPT}"
        probe, names, open_ = self._probe, self._names, self._open
        switch, stamp, sink, fail, lane, ended = probe.switch, probe.stamp, probe.sink, probe.fail, probe.lane, probe.ended
        count = self._count
        world = dist.group.WORLD

        def argument(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if name in kwargs:
                return kwargs[name]
            i = at.get(name)
            return args[i] if i is not None and i < len(args) else None

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not switch.on or _compiling() or sys._getframe(1).f_globals.get("__name__", "").startswith("torch."):
                return original(*args, **kwargs)
            try:
                group = argument("group", args, kwargs)
                name = names(base, world if group is None else group)
                size = _nbytes(argument(tensors, args, kwargs)) if tensors else 0
                key = next(count)
                open_[key] = (name, time.perf_counter_ns())
                ready = stamp()
            except Exception as exc:  # noqa: BLE001 - never reach the training loop
                fail(exc)
                return original(*args, **kwargs)
            try:
                work = original(*args, **kwargs)  # a failed collective raises here, as it would without dagtop
            except BaseException:
                open_.pop(key, None)
                raise
            try:
                if work is None or not argument("async_op", args, kwargs):
                    open_.pop(key, None)
                    sink(COLLECTIVE.event(name, lane, ready, stamp(), size))
                else:
                    def done(_: Any) -> None:
                        open_.pop(key, None)
                        ended(COLLECTIVE, name, ready, size)

                    work.get_future().add_done_callback(done)
            except Exception as exc:  # noqa: BLE001
                open_.pop(key, None)
                fail(exc)
            return work

        timed.__dagtop__ = True  # type: ignore[attr-defined]
        return timed
