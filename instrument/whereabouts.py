"""Where a rank is: the task open in the iteration under way, since when and what it is (:class:`TaskState`), for
the publisher's heartbeat.

Read on the publisher thread from what the hooks keep anyway (racy reads of a moment, never a lock): a rank stuck
in a collective, a loader or a layer says so every second, even while its training thread is blocked.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from instrument.events import CollectiveKind, TaskState, collective_name
from instrument.unit import RECOMPUTED

if TYPE_CHECKING:
    from instrument.probe import Moment
    from instrument.tracer import Tracer


class Whereabouts:
    """The heartbeat's probe of one tracer: call it for (iteration, open task, ``perf_counter_ns`` since, what the
    task is)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._open_seen: dict[str, int] = {}
        """Open task → when this thread first saw it open, for starts it cannot read as ns (CUDA events)."""

    def __call__(self) -> tuple[int, str, int, TaskState]:
        try:
            task, since, state = self._open_task()
        except Exception:  # noqa: BLE001 - a look at state another thread is changing; next second's will do
            task, since, state = "", None, TaskState.UNKNOWN
        now = time.perf_counter_ns()
        if not isinstance(since, int):  # a CUDA event: when this thread first saw the task open
            since = self._open_seen.get(task, now)
        self._open_seen = {task: since}
        return self._tracer.iteration, task, since, state

    def _open_task(self) -> tuple[str, Moment, TaskState]:
        tracer = self._tracer
        script: tuple[str, int] | None = tracer._script.in_flight() if tracer._script is not None else None
        if script is not None:
            return script[0], script[1], TaskState.COLLECTIVE
        in_flight = tracer._comm.in_flight() if tracer._comm is not None else None
        if in_flight is not None:
            return collective_name(CollectiveKind.ALL_REDUCE, in_flight[0]), in_flight[1], TaskState.COLLECTIVE
        loading = tracer._loading
        if loading is not None:
            return "loader next", loading, TaskState.OPEN
        for name, start in tracer._update_starts.copy().items():
            return name, start, TaskState.OPEN
        timers = tracer._layers if tracer._detailed_now else tracer._blocks
        # Backward runs last to first: the open one is the earliest unit begun and not accumulated into yet.
        begun = [u for u in timers.units if u.bwd_start is not None]
        for unit in [u for u in begun if u.last_grad is None] or begun[::-1]:
            return f"backward {unit.name}", unit.bwd_start, TaskState.OPEN
        for unit in timers.units:
            began = unit.fwd_start
            if began is not None:  # a recompute's marker is no moment: since when this thread first saw it
                return f"forward {unit.name}", None if began is RECOMPUTED else began, TaskState.OPEN
        events = tracer._events
        last = events[-1] if events else None
        if last is not None:
            return f"after {last[2]}", last[5], TaskState.BETWEEN
        if tracer.iteration:  # handed over, the next not begun
            return "between iterations", None, TaskState.BETWEEN
        return "", None, TaskState.UNKNOWN
