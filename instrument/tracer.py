"""The tracer a training rank holds: loader, copy and custom-task timing, the iteration boundary, and attach()."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Final

from instrument import wire
from instrument.wire import DEFAULT_ENDPOINT as DEFAULT_ENDPOINT  # noqa: PLC0414 - re-exported: it lived here

CLOSE_TIMEOUT_S: Final = 2.0

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

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._iterable)
        now = time.perf_counter_ns
        tracer = self._tracer
        while True:
            start = now()
            try:
                item = next(it)
            except StopIteration:
                return
            if tracer._on:
                tracer._events.append(("io", "load", "next", "main", start, now(), 0))
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

    __slots__ = ("_category", "_name", "_start", "_tracer")

    def __init__(self, tracer: Tracer, name: str, category: str) -> None:
        if category not in wire.CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {', '.join(wire.CATEGORIES)}")
        self._tracer, self._name, self._category, self._start = tracer, name[: wire.MAX_NAME_CHARS], category, 0

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        if self._tracer._on:
            self._tracer._events.append(
                (self._category, "custom", self._name, "main", self._start, time.perf_counter_ns(), 0)
            )


class Tracer:
    """Times one rank's iterations and hands each one to the publisher when ``optimizer.step()`` returns.

    Built by :func:`instrument.attach`; the constructor takes already-resolved settings.
    """

    def __init__(self, model: Any, optimizer: Any, *, rank: int, world: int, local_rank: int,
                 endpoint: str, granularity: str, sample_every: int) -> None:
        _watch_forks()
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.endpoint = endpoint
        self.granularity = granularity
        self.sample_every = sample_every
        self.iteration = 0
        from instrument.timing import Switch

        self._switch = Switch()
        self._forked = False
        self._warned = threading.Lock()
        self._closed = False
        self._events: list[tuple[Any, ...]] = []
        self._handles: list[Any] = []
        self._comm: Any = None
        self._telemetry: Any = None
        self._blocks: Any = None
        self._layers: Any = None
        try:
            self._install(model, optimizer)
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

    def _install(self, model: Any, optimizer: Any) -> None:
        import torch

        from instrument.publisher import Publisher
        from instrument.timing import UnitTimer, block_units, layer_units, model_name

        ddp, module = _unwrap(model)
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
        self._blocks = UnitTimer(block_units(module), self._events, stamp, self._lane, switch, self._fail)
        self._layers = UnitTimer(layer_units(module), self._events, stamp, self._lane, switch, self._fail)
        self._detailed_now = False
        self._switch_units(self._detailed(0))
        self._handles.append(optimizer.register_step_pre_hook(self._on_step_start))
        self._handles.append(optimizer.register_step_post_hook(self._on_step_end))
        self._update_start: Any = None
        self._params = sum(p.numel() for p in module.parameters())
        self._model_name = model_name(module)
        self._publisher = Publisher(self.endpoint, self.rank, self._hello, self._fail, self._cuda)
        if os.environ.get("DAGTOP_TELEMETRY", "") != "0":
            from instrument.telemetry import TelemetryThread

            cuda_index = None
            if self.device.type == "cuda":
                cuda_index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._telemetry = TelemetryThread(self._publisher.put_telemetry, rank=self.rank,
                                              local_rank=self.local_rank, host=socket.gethostname(),
                                              cuda_index=cuda_index)
        if ddp is not None:
            from instrument.comm import BucketTimer, time_buffer_sync

            time_buffer_sync(ddp, self._events.append, switch, self._fail)
            # Last: a comm hook cannot be unregistered, so nothing that can still fail comes after it.
            self._comm = BucketTimer(ddp, self._events.append, self._comm_stamp(ddp), switch, self._fail)
        elif self.world > 1:
            warnings.warn(f"dagtop: rank {self.rank} of {self.world} has no DistributedDataParallel around its model, "
                          "so no collective is timed (FSDP and hand-written collectives are not yet): the report "
                          "and the screen will say no communication was seen", RuntimeWarning, stacklevel=4)

    @property
    def enabled(self) -> bool:
        """False once the shim has disabled itself or been closed."""
        return self._on

    # ------------------------------------------------------------------ the attach API

    def loader(self, iterable: Iterable[Any]) -> TimedLoader:
        """Iterate ``iterable`` timing each wait: ("io", "load", "next", "main")."""
        return TimedLoader(self, iterable)

    def to_device(self, batch: Any, device: Any) -> Any:
        """Copy a batch to ``device`` timing it: ("pcie", "h2d", "to_device", "main" on CPU / "copy" on CUDA)."""
        if not self._on:
            return move(batch, device)[0]
        try:
            if self._cuda is not None and _is_cuda(device):
                from instrument.cuda import move_timed

                out, size, copy_start, copy_end = move_timed(self._cuda, batch, _device(device))  # CUDA events
                self._events.append(("pcie", "h2d", "to_device", "copy", copy_start, copy_end, size))
                return out
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return move(batch, device)[0]
        start = time.perf_counter_ns()
        out, size = move(batch, device)
        if self._on:
            self._events.append(("pcie", "h2d", "to_device", "main", start, time.perf_counter_ns(), size))
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
            self._events.append((category, phase, name[: wire.MAX_NAME_CHARS], lane, start_ns, end_ns, nbytes))

    def close(self) -> None:
        """Stop timing, flush, say bye. Idempotent, registered with atexit, never hangs."""
        if self._closed:
            return
        self._closed = True
        self._on = False
        atexit.unregister(self.close)
        self._remove_hooks()
        if self._telemetry is not None:
            self._telemetry.close()
        if not self._forked:
            self._publisher.close(CLOSE_TIMEOUT_S)

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

    def _on_step_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._on:
            try:
                # Backward is over: units whose backward ends at their last gradient accumulation are done.
                (self._layers if self._detailed_now else self._blocks).flush()
                self._update_start = self._stamp()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

    def _on_step_end(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The iteration boundary: emit the update, hand the iteration to the publisher, start the next."""
        if not self._on:
            return
        try:
            if self._update_start is not None:
                self._events.append(("compute", "update", "optimizer.step", self._lane, self._update_start,
                                     self._stamp(), 0))
                self._update_start = None
            # One list for the whole run (hooks hold its append): take what is there, leave what may arrive.
            count = len(self._events)
            events = self._events[:count]
            del self._events[:count]
            self._publisher.put_iteration(self.iteration, events)
            self.iteration += 1
            if self._comm is not None:
                # Buckets are rebuilt after iteration 0: note them during iteration 1, send them after it.
                self._comm.capture = self.iteration == 1
                if self.iteration == 2:
                    self._publisher.put_buckets(self._comm.final_buckets())
            detailed = self._detailed(self.iteration)
            if detailed != self._detailed_now:
                self._switch_units(detailed)
            if not self._publisher.alive:
                raise RuntimeError("the publisher thread stopped")
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _hello(self, seq: int) -> wire.Hello:
        import torch

        return wire.Hello(
            seq=seq, rank=self.rank, world=self.world, local_rank=self.local_rank,
            host=socket.gethostname()[: wire.MAX_NAME_CHARS], pid=os.getpid(), device=str(self.device),
            torch=torch.__version__, model=self._model_name[: wire.MAX_NAME_CHARS], params=self._params,
            granularity=self.granularity, wall_ns=time.time_ns(), mono_ns=time.perf_counter_ns(),
        )


def _unwrap(model: Any) -> tuple[Any, Any]:
    """(the DDP wrapper or None, the module whose units are timed) for a plain, DDP or compiled model.

    ``torch.compile(DDP(m))`` keeps its DDP under ``_orig_mod``: the comm hook goes there, the timing
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
