"""Collective timing of FSDP2 (``fully_shard``) units: all-gathers and reduce-scatters through FSDP's custom-comm
objects, HSDP's all-reduce through its all-reduce hook.

Which hook, and why. FSDP2 has no comm hook. What it offers, in torch 2.13:

- ``FSDPModule.set_custom_all_gather(comm)`` / ``set_custom_reduce_scatter(comm)``: public methods taking an
  ``AllGather`` / ``ReduceScatter`` object that FSDP calls for every collective of that unit, on the thread and
  the stream that issue it, with the tensors (so the bytes) and the process group. **This is the one used**:
  each call is one collective of one known unit, so it can be named by the unit; the wrapper delegates to the
  object FSDP held before (default, symmetric-memory or process-group allocation), so nothing else changes.
- ``set_all_reduce_hook``: called right *after* a unit's reduction, on its stream, with its output. Used for
  HSDP only, to end its all-reduce (which FSDP issues itself: no object to wrap); it starts where the
  reduce-scatter ended. On plain FSDP a hook would move FSDP's post-reduce work onto another stream: not set.
- ``record_function`` labels (``FSDP::all_gather``, ``FSDP::post_backward_reduce``): seen only by a running
  profiler, which costs +84 % on CPU (FIELD_NOTES).
- The all-gather / reduce-scatter streams: CUDA only, and they carry copy-in and copy-out kernels too.

Timing. Ready is a stamp just before the collective is issued; done is a stamp after the call returns when FSDP
asks for a synchronous collective (on CPU/gloo the call returns when the collective is over on this rank, as
BucketTimer's future does for DDP; on CUDA the stamp is an event on the comm stream, after the collective), or,
when FSDP asks for an asynchronous one (``unshard(async_op=True)``), the completion of the work's future. The
span includes waiting for the slowest rank, as intended: the monitor starts a collective at the latest ready
across ranks. Bytes are the full (unsharded) size: the all-gather's output, the reduce-scatter's input (HSDP's
all-reduce: the shard it reduces). ~2.5 µs per collective on a 2-core CPU (benchmarks/bench_fsdp.py).

Names, which the monitor matches across ranks: ``all-gather layers.0``, ``all-gather layers.0 (backward)``
(issued while autograd runs: the re-gather, or the backward prefetch, of resharded parameters),
``reduce-scatter layers.0``, ``all-reduce layers.0`` (HSDP); the root unit is named after the model's class. A
unit that runs twice in one iteration (gradient accumulation) gets `` #2``, `` #3``...; a process group smaller
than the job (HSDP's shard and replica groups) adds its ranks, ``[ranks 0,1]``, so that collectives of different
groups are not taken for one. Not timed: units with several parameter groups (``shard_placement_fn``
per-parameter meshes: FSDP refuses custom comms there), HSDP's all-reduce on a shard group of one rank (no
reduce-scatter to start it), and FSDP1 (no hook on its all-gathers).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from instrument.events import COLLECTIVE, CollectiveKind, collective_name
from instrument.probe import Moment, Probe

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

_graph_task_id = torch._C._current_graph_task_id

_WRAPPERS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
"""Segments that wrappers (torch.compile, activation checkpointing) add to a module's name: not the model's."""

_NO_HOOK: Any = object()
"""In ``ShardTimer._held``: no all-reduce hook was set on that unit (plain FSDP), so none is given back."""

MAX_RANKS_NAMED = 8
"""A process group of more ranks is named by its first two and its last."""


def _kinds(modules: Sequence[torch.nn.Module]) -> tuple[bool, bool]:
    """(some submodule is ``fully_shard``'ed (FSDP2), some is wrapped in FullyShardedDataParallel (FSDP1)).

    Neither can be true unless torch.distributed.fsdp was imported: a model without FSDP pays no import (a
    second on a 2-core machine).
    """
    if "torch.distributed.fsdp" not in sys.modules:
        return False, False
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    every = [m for root in modules for m in root.modules()]
    return (any(isinstance(m, FSDPModule) for m in every),
            any(isinstance(m, FullyShardedDataParallel) for m in every))


def untimed(modules: Sequence[torch.nn.Module], shards: ShardTimer | None) -> str | None:
    """What attach warns, after "rank R of W", when collectives of a multi-rank job without DDP go untimed."""
    if shards is not None and shards.units:
        if not shards.skipped:
            return None
        return f"times the collectives of {shards.units} fully_shard units, but not of {'; '.join(shards.skipped)}"
    if shards is not None:
        why = f"has fully_shard units whose collectives cannot be timed ({'; '.join(shards.skipped)})"
    elif _kinds(modules)[1]:
        why = ("trains with FullyShardedDataParallel (FSDP1), which offers no hook for its all-gathers (fully_shard "
               "is timed)")
    else:
        why = "has no DistributedDataParallel or fully_shard in its model"
    return (f"{why}, so no collective is timed (hand-written collectives are not): the report and the screen will "
            "say no communication was seen")


def _unit_name(fqn: str, module: object) -> str:
    from torch.distributed.fsdp import FSDPModule

    for wrapper in _WRAPPERS:
        fqn = fqn.replace(wrapper, "")
    if fqn not in ("", "_orig_mod"):
        return fqn
    # The root unit: its class as the user wrote it (fully_shard makes it a subclass, FSDP<Class>).
    return next((c for c in type(module).__mro__ if not issubclass(c, FSDPModule)), type(module)).__name__


class _Names:
    """A collective's name in the current iteration: `` #n`` for the n-th of one name, from the second on.

    The count restarts when the tracer's iteration changes (read on each call: no hook on the boundary, so it
    follows whatever ends an iteration). Forward and backward never issue collectives at once, so the
    counts need no lock.
    """

    __slots__ = ("_counts", "_full", "_iteration", "_seen")

    def __init__(self, iteration: Callable[[], int]) -> None:
        self._iteration = iteration
        self._seen = -1
        self._counts: dict[str, int] = {}
        self._full: dict[tuple[str, int], str] = {}
        """(base name, id of the process group) → the name with the group's ranks, made once."""

    def __call__(self, base: str, group: dist.ProcessGroup | None) -> str:
        it = self._iteration()
        if it != self._seen:
            self._counts.clear()
            self._seen = it
        name = self._full.get((base, id(group)))
        if name is None:
            name = self._full[(base, id(group))] = base + _group_suffix(group)
        n = self._counts.get(name, 0) + 1
        self._counts[name] = n
        return name if n == 1 else f"{name} #{n}"


def _group_suffix(group: dist.ProcessGroup | None) -> str:
    """'' for a group of the whole job, else its ranks: the same string on every rank of the group."""
    ranks = sorted(dist.get_process_group_ranks(group))
    if len(ranks) == dist.get_world_size():
        return ""
    shown = ranks if len(ranks) <= MAX_RANKS_NAMED else [*ranks[:2], "…", ranks[-1]]
    return f" [ranks {','.join(map(str, shown))}]"


class _Timed:
    """What the all-gather and reduce-scatter wrappers share: the timing around one call of the held comm."""

    def __init__(self, inner: Any, base: str, names: _Names, probe: Probe) -> None:
        self.inner = inner
        self.done: Moment = None
        """The stamp of the last synchronous call's end: where HSDP's all-reduce, issued right after, begins."""
        self._base, self._backward_base = base, f"{base} (backward)"
        self._names, self._probe = names, probe
        self._sink, self._stamp, self._switch, self._fail = probe.sink, probe.stamp, probe.switch, probe.fail

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)  # type: ignore[no-any-return]

    def _timed(self, call: Callable[[], Any], tensor: torch.Tensor, group: dist.ProcessGroup,
               backward_named: bool) -> Any:
        if not self._switch.on:
            return call()
        try:
            base = self._backward_base if backward_named and _graph_task_id() != -1 else self._base
            name = self._names(base, group)
            size = tensor.nbytes
            ready = self._stamp()
        except Exception as exc:  # noqa: BLE001 - never reach the training loop
            self._fail(exc)
            return call()
        work = call()  # a failed collective raises here, as it would without dagtop
        try:
            if work is None:
                self.done = self._stamp()
                self._sink(COLLECTIVE.event(name, self._probe.lane, ready, self.done, size))
            else:
                ended = self._probe.ended

                def done(fut: Any) -> None:
                    ended(COLLECTIVE, name, ready, size)

                work.get_future().add_done_callback(done)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        return work


class TimedAllGather(_Timed):
    """The all-gather FSDP held, timed: ``all-gather <unit>`` (``(backward)`` when autograd issued it)."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> Any:
        def call() -> Any:
            return self.inner(output_tensor=output_tensor, input_tensor=input_tensor, group=group, async_op=async_op)

        return self._timed(call, output_tensor, group, backward_named=True)


class TimedReduceScatter(_Timed):
    """The reduce-scatter FSDP held, timed: ``reduce-scatter <unit>`` (always in backward: no suffix)."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> Any:
        def call() -> Any:
            return self.inner(output_tensor=output_tensor, input_tensor=input_tensor, group=group, op=op,
                              async_op=async_op)

        return self._timed(call, input_tensor, group, backward_named=False)


class TimedAllReduce:
    """HSDP's all-reduce of a unit's reduced gradients across replicas: ``all-reduce <unit> [ranks …]``.

    FSDP issues it itself (``dist.all_reduce``), with no comm object to wrap. Its all-reduce hook
    (``set_all_reduce_hook``, public) runs right after it, on its stream: that is its end. It begins where the
    unit's reduce-scatter ended (FSDP issues it next, on a stream that waits for the reduce-scatter's). Without a
    reduce-scatter (a shard group of one rank) it is not timed. A hook the user had set still runs, after ours.
    """

    def __init__(self, scatter: _Timed, user_hook: Callable[[torch.Tensor], None] | None, base: str,
                 group: dist.ProcessGroup,
                 names: _Names, probe: Probe) -> None:
        self.user_hook = user_hook
        self._scatter, self._base, self._group = scatter, base, group
        self._names, self._probe = names, probe

    def __call__(self, reduce_output: torch.Tensor) -> None:
        probe = self._probe
        if probe.switch.on:
            try:
                start, self._scatter.done = self._scatter.done, None
                if start is not None:
                    probe.ended(COLLECTIVE, self._names(self._base, self._group), start, reduce_output.nbytes)
            except Exception as exc:  # noqa: BLE001 - never reach the training loop
                probe.fail(exc)
        if self.user_hook is not None:
            self.user_hook(reduce_output)


class ShardTimer:
    """Wraps the all-gather and reduce-scatter of every ``fully_shard``'ed module under ``roots``.

    Args:
        roots: the models as attached (their module names name the collectives).
        probe: the tracer's, on the ``comm`` lane (its sink is the tracer's list append: atomic, safe from comm
            threads; its stamp ``perf_counter_ns`` on CPU, a CUDA event on a GPU).
        iteration: the tracer's current iteration, for the per-iteration counts of repeated names.

    ``skipped`` lists the units left untimed, with why. :meth:`remove` gives FSDP back the comms it held.
    """

    @classmethod
    def of(cls, roots: Sequence[torch.nn.Module], probe: Probe, iteration: Callable[[], int]) -> ShardTimer | None:
        """The timer of the ``fully_shard`` units under ``roots``; None if there are none."""
        return cls(roots, probe, iteration) if _kinds(roots)[0] else None

    def __init__(self, roots: Sequence[torch.nn.Module], probe: Probe, iteration: Callable[[], int]) -> None:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        # FSDP's later switches (``set_symm_mem_for_comm``, ``set_allocate_memory_from_process_group_for_comm``)
        # replace a comm of its default types and refuse any other: as virtual subclasses of those, the timed
        # wrappers are replaced too (untimed from then on), so a setup that works without dagtop keeps working.
        DefaultAllGather.register(TimedAllGather)
        DefaultReduceScatter.register(TimedReduceScatter)
        names = _Names(iteration)
        self.skipped: list[str] = []
        self._held: list[tuple[FSDPModule, Any, Any, Any]] = []
        for root in roots:
            for fqn, module in root.named_modules():
                if isinstance(module, FSDPModule):
                    self._wrap(module, _unit_name(fqn, module), names, probe)

    def _wrap(self, module: FSDPModule, unit: str, names: _Names, probe: Probe) -> None:
        # FSDP keeps its comms on its parameter groups (private): read them, so as to wrap rather than replace.
        groups: list[Any] | None = getattr(module._get_fsdp_state(), "_fsdp_param_groups", None)
        if groups is not None and not groups:
            return  # a unit without parameters of its own issues no collective
        if groups is not None and len(groups) > 1:
            self.skipped.append(f"{unit} (several parameter groups: FSDP takes no custom comm there)")
            return
        group = groups[0] if groups else None
        gather = getattr(group, "_all_gather_comm", None)
        scatter = getattr(group, "_reduce_scatter_comm", None)
        if gather is None or scatter is None:
            self.skipped.append(f"{unit} (this torch keeps its comms elsewhere)")
            return
        # Virtual subclasses of FSDP's default comms (see __init__): the casts say so to the type checker.
        module.set_custom_all_gather(cast("AllGather", TimedAllGather(
            gather, collective_name(CollectiveKind.ALL_GATHER, unit), names, probe)))
        timed_scatter = TimedReduceScatter(scatter, collective_name(CollectiveKind.REDUCE_SCATTER, unit), names,
                                           probe)
        module.set_custom_reduce_scatter(cast("ReduceScatter", timed_scatter))
        # HSDP (a 2-D mesh): FSDP also all-reduces across replicas. On plain FSDP no hook is set, since one would
        # move FSDP's post-reduce work onto another stream.
        replicas = getattr(getattr(group, "mesh_info", None), "replicate_process_group", None)
        user_hook = getattr(group, "_all_reduce_hook", None) if replicas is not None else _NO_HOOK
        if replicas is not None:
            module.set_all_reduce_hook(TimedAllReduce(
                timed_scatter, user_hook, collective_name(CollectiveKind.ALL_REDUCE, unit), replicas, names, probe))
        self._held.append((module, gather, scatter, user_hook))

    @property
    def units(self) -> int:
        """How many units are timed."""
        return len(self._held)

    def remove(self) -> None:
        """Give each unit back the comms (and all-reduce hook) it held, where the timed ones are still in place."""
        held, self._held = self._held, []
        for module, gather, scatter, hook in held:
            # Best effort (close() runs at exit too): a wrapper left in place passes calls through once the
            # tracer is off.
            with contextlib.suppress(Exception):
                group = module._get_fsdp_state()._fsdp_param_groups[0]
                if isinstance(group._all_gather_comm, TimedAllGather):
                    module.set_custom_all_gather(gather)
                if isinstance(group._reduce_scatter_comm, TimedReduceScatter):
                    module.set_custom_reduce_scatter(scatter)
                if hook is not _NO_HOOK and isinstance(group._all_reduce_hook, TimedAllReduce):
                    group._all_reduce_hook = hook  # set_all_reduce_hook is typed to take no None: what it sets
