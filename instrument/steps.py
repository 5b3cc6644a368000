"""The tracer's hooks on the optimizer's step and the model's top forward (:class:`IterationHooks`): they tell the
iteration boundary (instrument/boundary.py) what happens, time the update, and hand each iteration to the publisher
where the boundary cuts it, switching between block and per-layer timing between iterations."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from instrument.events import UPDATE, RawEvent
from instrument.wire import ThreadCpu

if TYPE_CHECKING:
    import torch
    from torch.autograd.graph import Node
    from torch.optim.optimizer import Args, Kwargs

    from instrument.boundary import IterationBoundary
    from instrument.comm import BucketTimer
    from instrument.polled import Polled
    from instrument.probe import Moment, OwnTime, Stamp, Switch
    from instrument.publisher import Publisher
    from instrument.ranktracer import Granularity
    from instrument.timerset import TimerSet


class ThreadCpuCount:
    """The training thread's CPU time (``time.thread_time_ns``) in the iteration under way: since its start, in
    its updates and in its loader's ``next()``; the shim's own time in its hooks and DDP's launches of its
    buckets' all-reduces, which they add to ``own``; and the process's other threads' CPU time (gloo's), less the
    shim's threads' (:class:`~instrument.wire.ThreadCpu`'s parts)."""

    __slots__ = ("_updating", "load", "others", "own", "since", "update")

    def __init__(self, own: OwnTime) -> None:
        self.own = own
        self.since, self.update, self.load = time.thread_time_ns(), 0, 0
        self.others = self._beside(self.since)
        """The process's CPU time not the training thread's, less the shim's threads', at the iteration's start."""
        self._updating: dict[str, int] = {}
        """Optimizer step → the thread's CPU time when its update began, while it runs."""

    def update_began(self, name: str) -> None:
        self._updating[name] = time.thread_time_ns()

    def update_ended(self, name: str) -> None:
        start = self._updating.pop(name, None)
        if start is not None:
            self.update += time.thread_time_ns() - start

    def spent(self) -> ThreadCpu:
        """The iteration ending now; the count starts over for the next."""
        now = time.thread_time_ns()
        beside = self._beside(now)
        own = self.own
        spent = ThreadCpu(now - self.since, self.update, self.load, own.ns, own.launch_ns,
                          max(beside - self.others, 0))
        self.since, self.update, self.load, own.ns, own.launch_ns, self.others = now, 0, 0, 0, 0, beside
        return spent

    def _beside(self, thread_ns: int) -> int:
        """The process's CPU time so far less the training thread's (``thread_ns``, just read) and the shim's
        threads' (each as of its last turn: what one spends after it counts in the next iteration)."""
        return time.process_time_ns() - thread_ns - sum(t.cpu_ns for t in self.own.threads)


class IterationHooks:
    """What :class:`~instrument.tracer.Tracer` runs at the edges of an iteration; the tracer builds the collaborators
    declared here (``_install``) and registers these hooks."""

    iteration: int
    granularity: Granularity
    sample_every: int
    _switch: Switch
    _events: list[RawEvent]
    """One list for the whole run: the hooks hold its ``append``."""
    _boundary: IterationBoundary
    _update_starts: dict[str, Moment]
    """Optimizer step → when its update began (a stamp: ns, or a CUDA event), while it runs."""
    _cpu: ThreadCpuCount | None
    """The training thread's CPU time in the iteration under way, on a CPU rank (its work is the training
    thread's); None on a device."""
    _stamp: Stamp
    _lane: str
    _guard: Callable[[Callable[..., Any]], Callable[..., Any]]
    """:meth:`~instrument.probe.Probe.guard` of the compute lane's probe."""
    _blocks: TimerSet
    _layers: TimerSet
    """The timed units: blocks, or per layer on detailed iterations."""
    _detailed_now: bool
    _lead: torch.nn.Module | None
    """Of several models, the one whose forward opens an iteration: the first one run."""
    _ddp_of: dict[int, torch.nn.parallel.DistributedDataParallel | None]
    _comm: BucketTimer | None
    _polled: Polled | None
    """The host clock's collectives in flight (instrument/polled.py); None on a GPU."""
    _publisher: Publisher
    _grad_enabled: Callable[[], bool]
    _compiling: Callable[[], bool]
    _grad_fns: Callable[[object], list[Node]]
    """Run on every forward of the whole model: torch's own functions, bound once."""

    def _fail(self, exc: BaseException) -> None:
        raise NotImplementedError

    @property
    def _on(self) -> bool:
        return self._switch.on

    @_on.setter
    def _on(self, value: bool) -> None:
        self._switch.on = value

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

    def _main_task(self, event: RawEvent) -> None:
        """Record a task of the training thread; the first one after a backward may open the next iteration."""
        self._boundary.task()
        self._events.append(event)

    def _step_started(self, name: str) -> Callable[..., Any]:
        def step_started(optimizer: torch.optim.Optimizer, args: Args, kwargs: Kwargs) -> tuple[Args, Kwargs] | None:
            self._boundary.step_began()
            # ``args`` are step()'s own: the optimizer first, then the closure if passed by position.
            closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
            if closure is None:
                self._update_began(name)
                return None

            # optimizer.step(closure) (LBFGS, Lightning): forward and backward run inside the step, the
            # update after the closure returns (after its last call, for an optimizer that calls it again).
            def timed_closure(*a: Any, **k: Any) -> Any:
                result = closure(*a, **k)
                update_began(name)
                return result

            if "closure" in kwargs:
                return args, {**kwargs, "closure": timed_closure}
            return (args[0], timed_closure, *args[2:]), kwargs

        update_began = self._guard(self._update_began)
        return self._guard(step_started)

    def _update_began(self, name: str) -> None:
        self._backward_over()
        self._update_starts[name] = self._stamp()
        if self._cpu is not None:
            self._cpu.update_began(name)

    def _step_ended(self, name: str) -> Callable[..., None]:
        def step_ended(optimizer: torch.optim.Optimizer, args: Args, kwargs: Kwargs) -> None:
            start = self._update_starts.pop(name, None)
            if start is not None:
                self._events.append(UPDATE.event(name, self._lane, start, self._stamp()))
            if self._cpu is not None:
                self._cpu.update_ended(name)
            self._boundary.step_ended()

        return self._guard(step_ended)

    def _backward_over(self) -> None:
        # Backward is over: units whose backward ends at their last gradient accumulation are done; so are the
        # collectives its final callback did not see end (where there was none to queue it: instrument/polled.py).
        (self._layers if self._detailed_now else self._blocks).flush()
        if self._polled is not None and self._polled.open:
            self._polled.poll(time.perf_counter_ns())

    def _on_top_forward(self, module: torch.nn.Module, args: object) -> None:
        """A forward of the whole model: past a backward with no step to end it, it may begin the next iteration."""
        if not self._on or self._boundary.in_step or self._compiling() or not self._grad_enabled():
            return
        if self._lead is None:
            self._lead = module  # of several models, the one whose forward opens an iteration
        elif module is not self._lead:
            return
        try:
            ddp = self._ddp_of[id(module)]
            synced = None if ddp is None else bool(ddp.require_backward_grad_sync)
            self._boundary.forward_began(synced)
            if synced and self._comm is not None:
                self._comm.new_pass()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _after_top_forward(self, module: torch.nn.Module, args: object, output: object) -> None:
        if not self._on or self._compiling() or not self._grad_enabled():
            return
        try:
            for node in self._grad_fns(output):
                node.register_prehook(self._boundary.backward_began)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _end_iteration(self, cut: int | None) -> None:
        """Hand the iteration to the publisher: the events before ``cut`` (all if None), then start the next.

        Called by the boundary (:class:`~instrument.boundary.IterationBoundary`), which then resets itself."""
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
        self._publisher.put_iteration(self.iteration, batch, None if self._cpu is None else self._cpu.spent())
        self.iteration += 1
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
                self._publisher.put_buckets(buckets, self._comm.parameter_bytes, self._comm.copy_ns,
                                            self._comm.add_ns)
