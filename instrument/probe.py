"""What every timer of the shim works with, as one object: :class:`Probe` (where events go, how a moment is
stamped, on which lane, whether the shim is on, what an error does), and the guard every hook of the shim keeps:
an error switches the shim off with one warning and never reaches the training loop. Stdlib only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from instrument.events import RawEvent, TaskKind

if TYPE_CHECKING:
    import torch

    from instrument.polled import Polled

Moment: TypeAlias = "int | torch.cuda.Event | None"
"""A timestamp: ``perf_counter_ns()`` on CPU, a recorded CUDA event on a GPU, None where none may be taken (a
CUDA graph being captured)."""
Stamp = Callable[[], Moment]
"""Returns a timestamp (:data:`Moment`)."""
Fail = Callable[[BaseException], None]
"""Switches the shim off after an internal error, warning once (``Tracer._fail``)."""

R = TypeVar("R")


class Removable(Protocol):
    """A hook's handle, or anything the shim undoes the same way when it stops."""

    def remove(self) -> object: ...


class Switch:
    """Whether the shim is timing: one flag shared by every hook (an attribute read, cheaper than a call)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True


class OwnTime:
    """The shim's own time in its hooks on the training thread of a CPU rank (``perf_counter_ns``; and in the tap
    each bucket's all-reduce passes through, instrument/comm.py, less the real call), summed until
    the iteration's end reads it: what dagtop adds to the step there, which the advisor takes out of its predictions
    (they are for the job without dagtop). Each hook adds its own, the clock read on entry and on exit (0.16 µs a
    hook on the 2-core test machine, ~1 % of what the hooks cost); what torch spends calling the hooks is not
    counted (it is outside them).

    Beside it, ``launch_ns``: the real all-reduce calls the tap passes each bucket on to, DDP's own launch of its
    buckets' collectives on the training thread, which regrouping the buckets or ``no_sync`` changes. And
    ``threads``: the shim's own threads (the publisher's, the telemetry's), each keeping its CPU time so far in
    ``cpu_ns``, which the process's CPU time beside the training thread's is counted without."""

    __slots__ = ("launch_ns", "ns", "threads")

    def __init__(self) -> None:
        self.ns = 0
        self.launch_ns = 0
        self.threads: list[ThreadClock] = []


class ThreadClock(Protocol):
    """A thread of the shim's that keeps its own CPU time (``time.thread_time_ns``) as it runs."""

    cpu_ns: int


class Probe:
    """The collaborators a timer needs, travelling together.

    A hook reads them into locals when it is made (an attribute read per call would cost on the hot paths).

    Args:
        sink: takes each event (the tracer's ``events.append``: atomic, so any thread may call it).
        stamp: the clock of the events' start and end.
        lane: the lane the events go on (``main``, ``gpu``, ``comm``...).
        switch: whether the shim is on.
        fail: what an internal error does: switch the shim off, warning once.
        polled: on the host clock, the collectives in flight whose end the training thread's hooks notice
            (instrument/polled.py); None on a GPU, where a collective's future records its end.
        own: on the host clock, where the hooks add their own time (a CPU rank's training thread runs them
            inside its steps); None on a GPU, whose steps are the device's.
    """

    __slots__ = ("fail", "lane", "own", "polled", "sink", "stamp", "switch")

    def __init__(self, sink: Callable[[RawEvent], None], stamp: Stamp, lane: str, switch: Switch,
                 fail: Fail, polled: Polled | None = None, own: OwnTime | None = None) -> None:
        self.sink, self.stamp, self.lane, self.switch, self.fail = sink, stamp, lane, switch, fail
        self.polled, self.own = polled, own

    def on_lane(self, lane: str, stamp: Stamp | None = None) -> Probe:
        """This probe for events on another lane (and clock)."""
        return Probe(self.sink, self.stamp if stamp is None else stamp, lane, self.switch, self.fail, self.polled,
                     self.own)

    def ended(self, kind: TaskKind, name: str, start: Moment, nbytes: int = 0) -> None:
        """Record a task of ``kind`` on this lane that began at ``start`` and ends now; an error switches the shim
        off (for callbacks that run where an exception would reach torch: a collective's completion)."""
        try:
            self.sink((kind.category, kind.phase, name, self.lane, start, self.stamp(), nbytes))
        except Exception as exc:  # noqa: BLE001 - never reach the training loop
            self.fail(exc)

    def guard(self, hook: Callable[..., R]) -> Callable[..., R | None]:
        """``hook`` as the shim registers it: it does nothing while the shim is off (returns None), and an error
        in it switches the shim off with one warning instead of reaching training.

        One call more per hook: for the hooks that run once or twice per iteration. The per-unit hooks of
        instrument/timing.py, a few µs each and run for every layer, keep the same guard written inline.
        """
        switch, fail, own = self.switch, self.fail, self.own

        @functools.wraps(hook)
        def guarded(*args: Any, **kwargs: Any) -> R | None:
            if not switch.on:
                return None
            began = perf_counter_ns()
            try:
                return hook(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - never reach the training loop
                fail(exc)
                return None
            finally:
                if own is not None:
                    own.ns += perf_counter_ns() - began

        return guarded
