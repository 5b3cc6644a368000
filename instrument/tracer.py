"""The timing tracer of a training rank (:class:`~instrument.ranktracer.RankTracer`): :class:`Tracer` times the
loader, the copies, the script's own tasks and the units and collectives it wires up (instrument/wiring.py), and
hands each iteration to the publisher where its boundary (instrument/boundary.py) falls, from its hooks at the
edges of an iteration (instrument/steps.py)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from instrument import wire
from instrument.batch import TimedLoader, TimedTask, move
from instrument.boundary import IterationBoundary
from instrument.events import COPY, RawEvent
from instrument.identity import job_identity
from instrument.probe import Switch
from instrument.ranktracer import Closing, Granularity
from instrument.steps import IterationHooks, ThreadCpuCount
from instrument.whereabouts import Whereabouts
from instrument.wire_fields import MAX_NAME_CHARS, Loader
from instrument.wiring import as_device, is_cuda, optimizers, time_collectives, wire_models

if TYPE_CHECKING:
    import torch

    from instrument.collectives import ScriptCollectives
    from instrument.comm import BucketTimer
    from instrument.polled import Polled
    from instrument.probe import Removable
    from instrument.ranktracer import NullTracer, RankTracer
    from instrument.telemetry import TelemetryThread

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


class Tracer(IterationHooks, Closing):
    """Times one rank's iterations and hands each one to the publisher when ``optimizer.step()`` returns.

    Built by :func:`instrument.attach`; the constructor takes already-resolved settings.
    """

    def __init__(self, model: Any, optimizer: Any, *, rank: int, world: int, local_rank: int,
                 endpoint: str, granularity: Granularity, sample_every: int, heartbeat: bool = True,
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
        self._switch = Switch()
        self._forked = False
        self._warned = threading.Lock()
        self._closed = False
        self._events: list[RawEvent] = []
        self._handles: list[Removable] = []
        self._comm: BucketTimer | None = None
        self._polled: Polled | None = None
        self._script: ScriptCollectives | None = None
        self._telemetry: TelemetryThread | None = None
        self._optimizers: list[torch.optim.Optimizer] = []
        self._update_starts = {}
        self._cpu = None
        self._loading: int | None = None
        """``perf_counter_ns`` when the loader's pending ``next()`` began; None outside one (the heartbeat reads it)."""
        self._loader_said: Loader | None = None
        """The settings of the DataLoader last given to :meth:`loader`, sent with each hello."""
        from instrument.loader import WaitShare

        self._wait_share = WaitShare()
        """How much of the loader's wait is CPU work on the training thread, sent with the loader's settings."""
        self._lead = None
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

        from instrument.autograd import grad_fns
        from instrument.publisher import Publisher

        models = wire_models(model, self._events, self._switch, self._fail)
        self._module, self.device, self._cuda = models.modules[0], models.device, models.cuda
        self._stamp, self._lane, self._guard = models.stamp, models.lane, models.probe.guard
        self._polled = models.probe.polled
        if self.device.type == "cpu" and models.probe.own is not None:  # the host clock's probe counts its own
            self._cpu = ThreadCpuCount(models.probe.own)
        self._blocks, self._layers = models.blocks, models.layers
        self._detailed_now = False
        self._switch_units(self._detailed(0))
        self._optimizers = optimizers(optimizer)
        self._boundary = IterationBoundary(self._events, len(self._optimizers), self._end_iteration)
        single = len(self._optimizers) == 1
        for index, opt in enumerate(self._optimizers):
            name = "optimizer.step" if single else f"optimizer[{index}].step"
            self._handles.append(opt.register_step_pre_hook(self._step_started(name)))
            self._handles.append(opt.register_step_post_hook(self._step_ended(name)))
        # Inside a region Dynamo traces (attach(m), then m.compile()) they return at once, as every hook of the shim does.
        self._grad_enabled, self._compiling, self._grad_fns = torch.is_grad_enabled, torch.compiler.is_compiling, grad_fns
        self._ddp_of = models.ddp_of
        for m in models.given:
            # First of the model's hooks: the forward that ends an iteration ends it before a span of the model
            # (instrument/spans.py) hands over what it still holds of the last backward.
            self._handles.append(m.register_forward_pre_hook(self._on_top_forward, prepend=True))
            self._handles.append(m.register_forward_hook(self._after_top_forward))
        self._units_said, self._params, self._model_name = models.units_said, models.params, models.name
        where = Whereabouts(self) if heartbeat else None
        self._publisher = Publisher(self.endpoint, self.rank, self._hello, self._fail, self._cuda, where)
        if telemetry:
            from instrument.telemetry import TelemetryThread

            cuda_index = None
            if self.device.type == "cuda":
                cuda_index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._telemetry = TelemetryThread(self._publisher.put_telemetry, rank=self.rank,
                                              local_rank=self.local_rank, host=socket.gethostname(),
                                              cuda_index=cuda_index)
        if models.probe.own is not None:  # the CPU time beside the training thread's is counted without theirs
            models.probe.own.threads.extend(t for t in (self._publisher, self._telemetry) if t is not None)
        timed = time_collectives(models.ddp, models.modules, self.rank, self.world, models.probe,
                                 lambda: self.iteration)
        self._comm, self._script = timed.buckets, timed.script
        self._handles.extend(timed.handles)

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

    def to_device(self, batch: Any, device: torch.device | str) -> Any:
        """Copy a batch to ``device`` timing it: ("pcie", "h2d", "to_device", "main" on CPU / "copy" on CUDA)."""
        if not self._on:
            return move(batch, device)[0]
        try:
            if self._cuda is not None and is_cuda(device):
                from instrument.cuda import move_timed

                out, size, copy_start, copy_end = move_timed(self._cuda, batch, as_device(device))  # CUDA events
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
        return TimedTask(self, name, category) if self._on else contextlib.nullcontext()

    def record(self, category: str, phase: str, name: str, start_ns: int, end_ns: int, nbytes: int = 0,
               lane: str = "main") -> None:
        """Add a task timed elsewhere (a framework callback) to the current iteration: ``perf_counter_ns`` times.

        For integrations (instrument/hf.py, instrument/lightning.py) that see a task begin and end in two
        callbacks. Category, phase and lane must come from ``instrument.events``; they are not checked here.
        """
        if self._on:
            self._main_task((category, phase, name[: MAX_NAME_CHARS], lane, start_ns, end_ns, nbytes))

    def close(self) -> None:
        """Stop timing, flush, say bye. Idempotent, registered with atexit, never hangs: it waits at most
        :data:`CLOSE_TIMEOUT_S` for the publisher and :data:`SETTLE_TIMEOUT_S` for collectives in flight."""
        if self._closed:
            return
        self._closed = True
        if self._on and not self._forked and self._boundary.pending:
            with contextlib.suppress(Exception):  # the last iteration, which no next forward will end
                self._backward_over()
                self._boundary.end(None)
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
        for units in (getattr(self, "_blocks", None), getattr(self, "_layers", None)):  # None: _install failed
            if units is not None:
                units.remove()

    def _hello(self, seq: int) -> wire.Hello:
        import torch

        return wire.Hello(
            seq=seq, rank=self.rank, world=self.world, local_rank=self.local_rank,
            host=socket.gethostname()[: MAX_NAME_CHARS], pid=os.getpid(), device=str(self.device),
            torch=torch.__version__, model=self._model_name[: MAX_NAME_CHARS], params=self._params,
            granularity=self.granularity, wall_ns=time.time_ns(), mono_ns=time.perf_counter_ns(),
            units=self._units_said[: MAX_NAME_CHARS], job=self._job.run_id, master=self._job.master,
            restart=self._job.restart, started_ns=self.started_ns,
            loader=None if self._loader_said is None else dataclasses.replace(
                self._loader_said, wait_cpu_permille=self._wait_share.permille()),
        )




if TYPE_CHECKING:
    def _keeps_the_protocol(tracer: Tracer, null: NullTracer) -> tuple[RankTracer, RankTracer]:
        """mypy holds both tracers to the whole protocol here."""
        return tracer, null
