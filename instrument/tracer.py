"""The tracer a training rank holds: loader, copy and custom-task timing, the iteration boundary, and attach()."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import re
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Final

from instrument import wire
from instrument.events import CATEGORIES, COPY, LOAD, UPDATE, CollectiveKind, collective_name, custom
from instrument.identity import job_identity
from instrument.wire import DEFAULT_ENDPOINT as DEFAULT_ENDPOINT  # noqa: PLC0414 - re-exported: it lived here

CLOSE_TIMEOUT_S: Final = 2.0
SETTLE_TIMEOUT_S: Final = 10.0
"""How long ``close()`` lets the all-reduces still in flight end (a job leaving mid-backward): until torch has
freed dagtop's callbacks, ending the interpreter would abort the rank (instrument/teardown.py)."""

_live_tracers: weakref.WeakSet[Tracer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked DataLoader worker inherits the tracer but not its thread; it must never touch the zmq context.
    for tracer in list(_live_tracers):
        tracer._forked = True
        tracer._on = False


@functools.cache
def _watch_forks() -> None:
    """Register the fork hook, once per process (cached), when the first tracer is built: not at import."""
    os.register_at_fork(after_in_child=_after_fork_in_child)


def open_tracer() -> Tracer | None:
    """The tracer of this process that is still timing, if any."""
    return next((t for t in list(_live_tracers) if not t._closed and t._on), None)


def map_tensors(batch: Any, fn: Any) -> Any:
    """``batch`` (a tensor, or tuples, namedtuples, lists and dicts of them) with ``fn`` applied to each tensor."""
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (tuple, list)):
        items = [map_tensors(item, fn) for item in batch]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
            return type(batch)(*items)
        return type(batch)(items)
    if isinstance(batch, dict):
        return {key: map_tensors(item, fn) for key, item in batch.items()}
    return batch


def move(batch: Any, device: Any, non_blocking: bool = False) -> tuple[Any, int]:
    """Copy the tensors of ``batch`` to ``device`` (see :func:`map_tensors`); count their bytes."""
    sizes: list[int] = []

    def to(tensor: Any) -> Any:
        sizes.append(tensor.numel() * tensor.element_size())
        return tensor.to(device, non_blocking=non_blocking)

    return map_tensors(batch, to), sum(sizes)


class TimedLoader:
    """Wraps an iterable; times each ``next()``: the wait the training loop sees."""

    def __init__(self, tracer: Tracer, iterable: Iterable[Any]) -> None:
        self._tracer = tracer
        self._iterable = iterable
        tracer._loading = None

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._iterable)
        now, cpu = time.perf_counter_ns, time.thread_time_ns
        tracer = self._tracer
        share = tracer._wait_share
        category, phase = LOAD
        while True:
            start = tracer._loading = now()
            used = cpu()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                tracer._loading = None
            if tracer._on:
                end = now()
                tracer._main_task((category, phase, "next", "main", start, end, 0))
                share.add(cpu() - used, end - start)
            yield item


class NullTracer:
    """What attach() returns with ``DAGTOP_DISABLE=1`` (or after a failure): same methods, no timing."""

    rank = 0
    world = 1
    iteration = 0
    enabled = False

    def loader(self, iterable: Iterable[Any]) -> Iterable[Any]:
        return iterable

    def to_device(self, batch: Any, device: Any) -> Any:
        return move(batch, device)[0]

    def task(self, name: str, category: str = "other") -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def record(self, category: str, phase: str, name: str, start_ns: int, end_ns: int, nbytes: int = 0,
               lane: str = "main") -> None:
        pass

    def close(self) -> None:
        pass


class _Task:
    """A custom task: times a ``with`` block on the training thread."""

    __slots__ = ("_kind", "_name", "_start", "_tracer")

    def __init__(self, tracer: Tracer, name: str, category: str) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {', '.join(CATEGORIES)}")
        self._tracer, self._name, self._kind, self._start = tracer, name[: wire.MAX_NAME_CHARS], custom(category), 0

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        if self._tracer._on:
            self._tracer._main_task(self._kind.event(self._name, "main", self._start, time.perf_counter_ns()))


class Tracer:
    """Times one rank's iterations and hands each one to the publisher when ``optimizer.step()`` returns.

    Built by :func:`instrument.attach`; the constructor takes already-resolved settings.
    """

    def __init__(self, model: Any, optimizer: Any, *, rank: int, world: int, local_rank: int,
                 endpoint: str, granularity: str, sample_every: int, heartbeat: bool = True,
                 telemetry: bool = True) -> None:
        _watch_forks()
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.endpoint = endpoint
        self.granularity = granularity
        self.sample_every = sample_every
        self.iteration = 0
        self.started_ns = time.time_ns()
        """When this process attached: with its pid, which process of the rank this is."""
        self._job = job_identity()
        """Which job and incarnation, for the hello."""
        from instrument.timing import Switch

        self._switch = Switch()
        self._forked = False
        self._warned = threading.Lock()
        self._closed = False
        self._events: list[tuple[Any, ...]] = []
        self._handles: list[Any] = []
        self._comm: Any = None
        self._script: Any = None
        self._telemetry: Any = None
        self._blocks: Any = None
        self._layers: Any = None
        self._optimizers: list[Any] = []
        self._update_starts: dict[str, Any] = {}
        self._loading: int | None = None
        self._loader_said: wire.Loader | None = None
        """The settings of the DataLoader last given to :meth:`loader`, sent with each hello."""
        from instrument.loader import WaitShare

        self._wait_share = WaitShare()
        """How much of the loader's wait is CPU work on the training thread, sent with the loader's settings."""
        """``perf_counter_ns`` when the loader's pending ``next()`` began; None outside one (the heartbeat reads it)."""
        self._open_seen: dict[str, int] = {}
        """Open task → when the publisher thread first saw it open, for starts it cannot read as ns (CUDA events)."""
        self._in_step = 0
        """Optimizer steps under way: a forward inside one (a closure's) begins no iteration."""
        self._stepped = False
        """With several optimizers: a step ended since the iteration began."""
        self._step_mark: int | None = None
        self._load_mark: int | None = None
        """Where in ``_events`` the last step ended / the first loader wait or copy after a backward began."""
        self._backwards = 0
        """Backward passes through the whole model since the iteration began (micro-batches)."""
        self._backward_started = False
        self._cadence: int | None = None
        """Backwards per step (the fewest seen at a step): when a model without DDP is due one; None before."""
        self._lead: Any = None
        self._synced: bool | None = None
        """Whether the last forward's backward all-reduces (DDP outside ``no_sync``); None without DDP."""
        try:
            self._install(model, optimizer, heartbeat, telemetry)
        except BaseException:
            with contextlib.suppress(Exception):
                self._remove_hooks()
            if self._telemetry is not None:
                self._telemetry.close()
            if hasattr(self, "_publisher"):
                self._publisher.close(0.0)
            raise
        _live_tracers.add(self)
        atexit.register(self.close)

    def _install(self, model: Any, optimizer: Any, heartbeat: bool, telemetry: bool) -> None:
        import torch

        from instrument.publisher import Publisher
        from instrument.timing import TimerSet, block_units, layer_units, model_name
        from instrument.timing import _grad_fns as grad_fns

        models = list(model) if isinstance(model, (list, tuple)) else [model]
        if not models:
            raise ValueError("no model given")
        unwrapped = [_unwrap(m) for m in models]
        ddp, module = unwrapped[0]  # the first model's DDP has its collectives timed
        if sum(d is not None for d, _ in unwrapped[1:]):
            warnings.warn("dagtop: several models in DistributedDataParallel: only the first one's gradient buckets "
                          "are timed (their names would collide); the others' all-reduces count as untimed time",
                          RuntimeWarning, stacklevel=4)
        self._module = module
        first = next(module.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self._cuda: Any = None
        if self.device.type == "cuda":
            from instrument.cuda import CudaTiming

            self._cuda = CudaTiming(self.device)
        stamp = self._cuda.stamp if self._cuda is not None else time.perf_counter_ns
        self._stamp = stamp
        self._lane = "gpu" if self._cuda is not None else "main"

        switch = self._switch
        modules = [m for _, m in unwrapped]
        # The units, and around them the modules whose own work falls between them (instrument/spans.py).
        self._blocks = TimerSet.of(_units(block_units, modules), _spans(block_units, modules), self._events, stamp,
                                   self._lane, switch, self._fail)
        self._layers = TimerSet.of(_units(layer_units, modules), _spans(layer_units, modules), self._events, stamp,
                                   self._lane, switch, self._fail)
        self._detailed_now = False
        self._switch_units(self._detailed(0))
        self._optimizers = _optimizers(optimizer)
        single = len(self._optimizers) == 1
        for index, opt in enumerate(self._optimizers):
            name = "optimizer.step" if single else f"optimizer[{index}].step"
            self._handles.append(opt.register_step_pre_hook(self._step_started(name)))
            self._handles.append(opt.register_step_post_hook(self._step_ended(name)))
        # Run on every forward of the whole model: torch's own functions, bound once. Inside a region Dynamo
        # traces (attach(m), then m.compile()) they return at once, as every hook of the shim does.
        self._grad_enabled, self._compiling, self._grad_fns = torch.is_grad_enabled, torch.compiler.is_compiling, grad_fns
        self._ddp_of = {id(m): d for m, (d, _) in zip(models, unwrapped)}
        for m in models:
            # First of the model's hooks: the forward that ends an iteration ends it before a span of the model
            # (instrument/spans.py) hands over what it still holds of the last backward.
            self._handles.append(m.register_forward_pre_hook(self._on_top_forward, prepend=True))
            self._handles.append(m.register_forward_hook(self._after_top_forward))
        self._units_said = (f"{describe_units([u.name for u in self._blocks.units])}; "
                            f"{len(self._layers.units)} layers")
        self._params = sum(p.numel() for m in modules for p in m.parameters())
        self._model_name = "+".join(model_name(m) for m in modules)
        where = self._where if heartbeat else None
        self._publisher = Publisher(self.endpoint, self.rank, self._hello, self._fail, self._cuda, where)
        if telemetry:
            from instrument.telemetry import TelemetryThread

            cuda_index = None
            if self.device.type == "cuda":
                cuda_index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._telemetry = TelemetryThread(self._publisher.put_telemetry, rank=self.rank,
                                              local_rank=self.local_rank, host=socket.gethostname(),
                                              cuda_index=cuda_index)
        shards = None
        if ddp is not None:
            from instrument.comm import BucketTimer, time_buffer_sync

            time_buffer_sync(ddp, self._events.append, switch, self._fail)
            try:
                self._comm = BucketTimer(ddp, self._events.append, self._comm_stamp(ddp), switch, self._fail)
            except Exception as exc:  # noqa: BLE001 - a torch without the reducer's process-group swap
                warnings.warn(f"dagtop: DDP's gradient all-reduces are not timed on this torch ({exc}); "
                              "their time counts as untimed", RuntimeWarning, stacklevel=4)
        elif self.world > 1:
            from instrument.fsdp import ShardTimer, untimed

            # fully_shard (FSDP2): all-gathers, reduce-scatters (and HSDP's all-reduce) through FSDP's own API.
            shards = ShardTimer.of(modules, self._events.append, stamp, switch, self._fail, lambda: self.iteration)
            if shards is not None:
                self._handles.append(shards)  # its remove() gives FSDP back the comms it held
            reason = untimed(modules, shards)
            if reason:
                warnings.warn(f"dagtop: rank {self.rank} of {self.world} {reason}", RuntimeWarning, stacklevel=4)
        if ddp is not None or shards is not None:
            from instrument.collectives import ScriptCollectives

            # The script's own all_reduce, barrier... as collectives across ranks, beside DDP's or FSDP's.
            self._script = ScriptCollectives(self._events.append, stamp, switch, self._fail, lambda: self.iteration)
            self._handles.append(self._script)  # its remove() gives torch.distributed its functions back

    @property
    def enabled(self) -> bool:
        """False once the shim has disabled itself or been closed."""
        return self._on

    # ------------------------------------------------------------------ the attach API

    def loader(self, iterable: Iterable[Any]) -> TimedLoader:
        """Iterate ``iterable`` timing each wait: ("io", "load", "next", "main"). A DataLoader's settings go out
        with the next hello (the advisor's input pipeline advice)."""
        from instrument.loader import describe_loader

        self._loader_said = describe_loader(iterable) or self._loader_said
        return TimedLoader(self, iterable)

    def to_device(self, batch: Any, device: Any) -> Any:
        """Copy a batch to ``device`` timing it: ("pcie", "h2d", "to_device", "main" on CPU / "copy" on CUDA)."""
        if not self._on:
            return move(batch, device)[0]
        try:
            if self._cuda is not None and _is_cuda(device):
                from instrument.cuda import move_timed

                out, size, copy_start, copy_end = move_timed(self._cuda, batch, _device(device))  # CUDA events
                self._main_task(COPY.event("to_device", "copy", copy_start, copy_end, size))
                return out
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return move(batch, device)[0]
        start = time.perf_counter_ns()
        out, size = move(batch, device)
        if self._on:
            self._main_task(COPY.event("to_device", "main", start, time.perf_counter_ns(), size))
        return out

    def task(self, name: str, category: str = "other") -> contextlib.AbstractContextManager[None]:
        """Time a ``with`` block as (category, "custom", name, "main")."""
        return _Task(self, name, category) if self._on else contextlib.nullcontext()

    def record(self, category: str, phase: str, name: str, start_ns: int, end_ns: int, nbytes: int = 0,
               lane: str = "main") -> None:
        """Add a task timed elsewhere (a framework callback) to the current iteration: ``perf_counter_ns`` times.

        For integrations (instrument/hf.py, instrument/lightning.py) that see a task begin and end in two
        callbacks. Category, phase and lane must come from ``instrument.events``; they are not checked here.
        """
        if self._on:
            self._main_task((category, phase, name[: wire.MAX_NAME_CHARS], lane, start_ns, end_ns, nbytes))

    def close(self) -> None:
        """Stop timing, flush, say bye. Idempotent, registered with atexit, never hangs: it waits at most
        :data:`CLOSE_TIMEOUT_S` for the publisher and :data:`SETTLE_TIMEOUT_S` for collectives in flight."""
        if self._closed:
            return
        self._closed = True
        if self._on and not self._forked and (self._stepped or self._backward_done()):
            with contextlib.suppress(Exception):  # the last iteration, which no next forward will end
                self._backward_over()
                self._end_iteration(None)
        self._on = False
        atexit.unregister(self.close)
        self._remove_hooks()
        if self._comm is not None:
            with contextlib.suppress(Exception):
                self._comm.remove()
        if self._telemetry is not None:
            self._telemetry.close()
        if not self._forked:
            self._publisher.close(CLOSE_TIMEOUT_S)
        if self._comm is not None:  # collectives still in flight: let torch free their callbacks while it can
            self._comm.pending.wait(SETTLE_TIMEOUT_S)

    # ------------------------------------------------------------------ internals

    @property
    def _on(self) -> bool:
        return self._switch.on

    @_on.setter
    def _on(self, value: bool) -> None:
        self._switch.on = value

    def _fail(self, exc: BaseException) -> None:
        """Any internal error: stop timing and publishing, warn once, let training go on."""
        if not self._warned.acquire(blocking=False):
            return
        self._on = False
        warnings.warn(
            f"dagtop: the instrument shim disabled itself after an internal error ({type(exc).__name__}: {exc}); "
            "training continues untimed",
            RuntimeWarning,
            stacklevel=2,
        )
        with contextlib.suppress(Exception):
            self._remove_hooks()
        if self._telemetry is not None:
            self._telemetry.close()
        if not self._forked and hasattr(self, "_publisher"):
            self._publisher.close(0.0)

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for units in (self._blocks, self._layers):
            if units is not None:
                units.remove()

    def _detailed(self, iteration: int) -> bool:
        return self.granularity == "layer" or (self.sample_every > 0 and iteration % self.sample_every == 0)

    def _switch_units(self, detailed: bool) -> None:
        """Per-layer hooks on detailed iterations, block hooks otherwise: never both (they would overlap)."""
        if detailed and not self._layers.installed:
            self._blocks.remove()
            self._layers.install()
        elif not detailed and not self._blocks.installed:
            self._layers.remove()
            self._blocks.install()
        self._detailed_now = detailed

    def _comm_stamp(self, ddp: Any) -> Any:
        # NCCL futures complete at enqueue, so a CUDA job times its collectives on the stream.
        return self._cuda.stamp if self._cuda is not None else time.perf_counter_ns

    # ------------------------------------------------------------------ iteration boundaries
    #
    # An iteration ends when ``optimizer.step()`` returns: with one optimizer, that is the boundary. With several
    # optimizers, or when a step is skipped (GradScaler on an overflow calls no ``step()``), only the next
    # training forward of the model tells that an iteration is over: it ends there, the events it owns being
    # those recorded up to the last step's end, or else up to the first loader wait or copy after the backward
    # (the next iteration's). Under gradient accumulation a forward after a backward is the next micro-batch,
    # not a new iteration: DDP says which (``require_backward_grad_sync`` is False under ``no_sync``); a model
    # without DDP is due a step every as many backwards as the fewest it took to step (before its first step,
    # nothing is taken for skipped).

    def _main_task(self, event: tuple[Any, ...]) -> None:
        """Record a task of the training thread; the first one after a backward may open the next iteration."""
        if self._load_mark is None and self._backward_done():
            self._load_mark = len(self._events)
        self._events.append(event)

    def _backward_done(self) -> bool:
        return self._backwards > 0 or self._backward_started

    def _step_started(self, name: str) -> Any:
        def step_started(optimizer: Any, args: Any, kwargs: Any) -> Any:
            if not self._on:
                return None
            try:
                self._in_step += 1
                # ``args`` are step()'s own: the optimizer first, then the closure if passed by position.
                closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
                if closure is None:
                    self._backward_over()
                    self._update_starts[name] = self._stamp()
                    return None
                # optimizer.step(closure) (LBFGS, Lightning): forward and backward run inside the step, the
                # update after the closure returns (after its last call, for an optimizer that calls it again).
                def timed_closure(*a: Any, **k: Any) -> Any:
                    result = closure(*a, **k)
                    if self._on:
                        try:
                            self._backward_over()
                            self._update_starts[name] = self._stamp()
                        except Exception as exc:  # noqa: BLE001
                            self._fail(exc)
                    return result

                if "closure" in kwargs:
                    return args, {**kwargs, "closure": timed_closure}
                return (args[0], timed_closure, *args[2:]), kwargs
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                return None

        return step_started

    def _step_ended(self, name: str) -> Any:
        def step_ended(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not self._on:
                return
            try:
                self._in_step = max(0, self._in_step - 1)
                start = self._update_starts.pop(name, None)
                if start is not None:
                    self._events.append(UPDATE.event(name, self._lane, start, self._stamp()))
                backwards = self._backwards + self._backward_started
                if backwards:  # a step takes at least a cycle's backwards: the fewest seen is the cycle
                    self._cadence = backwards if self._cadence is None else min(self._cadence, backwards)
                if len(self._optimizers) == 1:
                    self._end_iteration(None)
                else:
                    self._stepped = True
                    self._step_mark = len(self._events)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

        return step_ended

    def _backward_over(self) -> None:
        # Backward is over: units whose backward ends at their last gradient accumulation are done.
        (self._layers if self._detailed_now else self._blocks).flush()

    def _on_top_forward(self, module: Any, args: Any) -> None:
        """A forward of the whole model: past a backward with no step to end it, it may begin the next iteration."""
        if not self._on or self._in_step or self._compiling() or not self._grad_enabled():
            return
        if self._lead is None:
            self._lead = module  # of several models, the one whose forward opens an iteration
        elif module is not self._lead:
            return
        try:
            if self._backward_started:
                self._backwards += 1
                self._backward_started = False
            if self._backwards and (self._stepped or self._step_skipped()):
                self._end_iteration(self._step_mark if self._stepped else self._load_mark)
            self._load_mark = None
            ddp = self._ddp_of[id(module)]
            self._synced = None if ddp is None else bool(ddp.require_backward_grad_sync)
            if self._synced and self._comm is not None:
                self._comm.new_pass()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _step_skipped(self) -> bool:
        """A backward that should have been followed by a step was not (a GradScaler skip)."""
        if self._synced is not None:  # DDP: the backward all-reduced the gradients, so a step was due
            return self._synced
        return self._cadence is not None and self._backwards >= self._cadence

    def _after_top_forward(self, module: Any, args: Any, output: Any) -> None:
        if not self._on or self._compiling() or not self._grad_enabled():
            return
        try:
            for node in self._grad_fns(output):
                node.register_prehook(self._on_top_backward)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _on_top_backward(self, grad_outputs: Any) -> None:
        self._backward_started = True

    def _end_iteration(self, cut: int | None) -> None:
        """Hand the iteration to the publisher: the events before ``cut`` (all if None), then start the next."""
        events = self._events
        if cut is None:
            # One list for the whole run (hooks hold its append): take what is there, leave what may arrive.
            count = len(events)
            batch = events[:count]
            del events[:count]
        else:
            # Ended by the next forward: nothing else is running. Units ending at their last gradient
            # accumulation are done; they belong before the cut, with the rest of the backward.
            count = len(events)
            self._backward_over()
            flushed = events[count:]
            del events[count:]
            batch = events[:cut] + flushed
            del events[:cut]
        self._publisher.put_iteration(self.iteration, batch)
        self.iteration += 1
        self._stepped = False
        self._step_mark = None
        self._load_mark = None
        self._backwards = 0
        self._backward_started = False
        self._after_iteration()
        detailed = self._detailed(self.iteration)
        if detailed != self._detailed_now:
            self._switch_units(detailed)
        if not self._publisher.alive:
            raise RuntimeError("the publisher thread stopped")

    def _after_iteration(self) -> None:
        if self._comm is not None:
            buckets = self._comm.iteration_done()  # a new map each time DDP rebuilds its buckets
            if buckets is not None:
                self._publisher.put_buckets(buckets, self._comm.parameter_bytes)

    def _where(self) -> tuple[int, str, int]:
        """The iteration under way, the task open in it and since when: read on the publisher thread for its
        heartbeat, from what the hooks keep anyway (racy reads of a moment, never a lock)."""
        try:
            task, since = self._open_task()
        except Exception:  # noqa: BLE001 - a look at state another thread is changing; next second's will do
            task, since = "", None
        now = time.perf_counter_ns()
        if not isinstance(since, int):  # a CUDA event: when this thread first saw the task open
            since = self._open_seen.get(task, now)
        self._open_seen = {task: since}
        return self.iteration, task, since

    def _open_task(self) -> tuple[str, Any]:
        script: tuple[str, int] | None = self._script.in_flight() if self._script is not None else None
        if script is not None:
            return script
        in_flight = self._comm.in_flight() if self._comm is not None else None
        if in_flight is not None:
            return collective_name(CollectiveKind.ALL_REDUCE, in_flight[0]), in_flight[1]
        loading = self._loading
        if loading is not None:
            return "loader next", loading
        for name, start in self._update_starts.copy().items():
            return name, start
        timers = self._layers if self._detailed_now else self._blocks
        # Backward runs last to first: the open one is the earliest unit begun and not accumulated into yet.
        begun = [u for u in timers.units if u.bwd_start is not None]
        for unit in [u for u in begun if u.last_grad is None] or begun[::-1]:
            return f"backward {unit.name}", unit.bwd_start
        for unit in timers.units:
            if unit.fwd_start is not None:
                return f"forward {unit.name}", unit.fwd_start
        events = self._events
        last = events[-1] if events else None
        if last is not None:
            return f"after {last[2]}", last[5]
        return ("between iterations" if self.iteration else ""), None  # handed over, the next not begun

    def _hello(self, seq: int) -> wire.Hello:
        import torch

        return wire.Hello(
            seq=seq, rank=self.rank, world=self.world, local_rank=self.local_rank,
            host=socket.gethostname()[: wire.MAX_NAME_CHARS], pid=os.getpid(), device=str(self.device),
            torch=torch.__version__, model=self._model_name[: wire.MAX_NAME_CHARS], params=self._params,
            granularity=self.granularity, wall_ns=time.time_ns(), mono_ns=time.perf_counter_ns(),
            units=self._units_said[: wire.MAX_NAME_CHARS], job=self._job.run_id, master=self._job.master,
            restart=self._job.restart, started_ns=self.started_ns,
            loader=None if self._loader_said is None else dataclasses.replace(
                self._loader_said, wait_cpu_permille=self._wait_share.permille()),
        )


def _optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers behind ``optimizer``: one, a list of them, or wrappers (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) whose ``step()`` calls the torch one's."""
    items = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if not items:
        raise ValueError("no optimizer given")
    unwrapped = []
    for opt in items:
        while not hasattr(opt, "_optimizer_step_pre_hooks"):  # a torch Optimizer's, set by its __init__
            inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
            if inner is None or inner is opt:
                raise TypeError(f"{type(opt).__name__} is not a torch optimizer and wraps none")
            opt = inner
        unwrapped.append(opt)
    return unwrapped


def describe_units(names: list[str]) -> str:
    """``6 blocks: embed, layers.0…3, head``: numbered runs of one prefix (a ModuleList's members) folded."""
    parts: list[str] = []
    run: tuple[str, int, int] | None = None  # prefix, first, last
    for name in [*names, ""]:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if run is not None and match and match[1] == run[0] and int(match[2]) == run[2] + 1:
            run = (run[0], run[1], int(match[2]))
            continue
        if run is not None:
            prefix, first, last = run
            parts.append(f"{prefix}{first}" if first == last else f"{prefix}{first}…{last}")
        run = (match[1], int(match[2]), int(match[2])) if match else None
        if not match and name:
            parts.append(name)
    return f"{len(names)} block{'s' * (len(names) != 1)}: {', '.join(parts)}"


def _units(find: Any, modules: list[Any]) -> list[tuple[str, Any]]:
    """``find``'s units of each model; with several models, each unit's name begins with its model's."""
    if len(modules) == 1:
        return list(find(modules[0]))
    return [(f"{prefix}.{name}", unit) for prefix, m in zip(_prefixes(modules), modules) for name, unit in find(m)]


def _spans(find: Any, modules: list[Any]) -> list[list[tuple[str, Any]]]:
    """The span levels around ``find``'s units of each model (instrument/spans.py), named as :func:`_units`
    names the units; the models are disjoint, so their levels of one depth are one level."""
    from instrument.units import span_levels

    if len(modules) == 1:
        return span_levels(modules[0], find(modules[0]))
    levels: list[list[tuple[str, Any]]] = []
    for prefix, m in zip(_prefixes(modules), modules):
        for depth, level in enumerate(span_levels(m, find(m), prefix)):
            if depth == len(levels):
                levels.append([])
            levels[depth].extend(level)
    return levels


def _prefixes(modules: list[Any]) -> list[str]:
    """Each model's name, numbered where two are of one class."""
    from instrument.timing import model_name

    names = [model_name(m) for m in modules]
    return [f"{n}{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def _unwrap(model: Any) -> tuple[Any, Any]:
    """(the DDP wrapper or None, the module whose units are timed) for a plain, DDP or compiled model.

    ``torch.compile(DDP(m))`` keeps its DDP under ``_orig_mod``: the bucket timer goes there, the timing
    hooks on the compiled wrapper, outside the region Dynamo traces.
    """
    import torch

    ddp_type = torch.nn.parallel.DistributedDataParallel
    if isinstance(model, ddp_type):
        return model, model.module
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, ddp_type):
        return inner, model
    return None, model


def _is_cuda(device: Any) -> bool:
    return str(device).startswith("cuda")


def _device(device: Any) -> Any:
    import torch

    return torch.device(device)
