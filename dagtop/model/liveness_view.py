"""What liveness says (dagtop/model/liveness.py judges it): the task a rank has open, the ranks holding a stalled
job, the stalls and restarts on record, and the line the screen shows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from instrument.events import TaskState


class OpenTask(str):
    """A rank's task as its heartbeat named it (``all-reduce bucket 7``, ``after optimizer.step``), carrying what it
    is (:class:`TaskState`, the heartbeat's ``state``): it compares, hashes and prints as the name, and the monitor
    reads the state, never the name's grammar. A plain ``str`` task is :attr:`TaskState.UNKNOWN`."""

    state: TaskState

    def __new__(cls, name: str, state: TaskState = TaskState.UNKNOWN) -> OpenTask:  # noqa: PYI034 - typing.Self is 3.11+
        task = super().__new__(cls, name)
        task.state = state
        return task


def state_of(task: str) -> TaskState:
    """What a task is: its :class:`OpenTask`'s state; :attr:`TaskState.UNKNOWN` for a plain name."""
    return task.state if isinstance(task, OpenTask) else TaskState.UNKNOWN


def heard_state(value: int) -> TaskState:
    """A heartbeat's ``state``; one this monitor does not know (a newer rank's) is unknown."""
    try:
        return TaskState(value)
    except ValueError:
        return TaskState.UNKNOWN


_WORKING: Final = (TaskState.OPEN, TaskState.COLLECTIVE)
"""The states in which a rank is *in* its task (``in loader next``); in the others its task is said as it is
(``after optimizer.step``, ``between iterations``, or an older rank's task, whose state it did not say)."""

Waiting = tuple[tuple[str, tuple[int, ...]], ...]
"""(task, ranks) for each task some ranks have open, by their first rank: ``(("all-reduce bucket 7", (0, 1)),)``;
each task an :class:`OpenTask` when it came from a heartbeat."""


@dataclass(frozen=True, slots=True)
class Holder:
    """A rank that holds a stalled job: where it was, and for how long."""

    rank: int
    task: str
    """Its open task (as its last heartbeat said, or after its last frame's last task; empty if unknown)."""
    open_s: float
    """How long it had that task open (0 when unknown: a silent rank)."""
    silent_s: float = 0.0
    """How long it went unheard (0: heard from)."""

    def describe(self) -> str:
        """``in loader next for 38 s``; ``silent 42 s (last: backward layers.3)``."""
        if self.silent_s:
            return f"silent {self.silent_s:.0f} s" + (f" (last: {self.task})" if self.task else "")
        if not self.task:
            return "heard from, no task known"
        if state_of(self.task) in _WORKING:
            return f"in {self.task} for {self.open_s:.0f} s"
        return f"{self.task} for {self.open_s:.0f} s"


@dataclass(frozen=True, slots=True)
class Stall:
    """One stall of the job: no iteration completed for a while."""

    iteration: int
    """The iteration that stalled (:attr:`confirmed` once its analysis said so)."""
    holders: tuple[Holder, ...]
    """The ranks that held the others (the latest seen while it lasted); empty when none could be told."""
    waiting: Waiting
    """Where every other rank heard from was, as its heartbeat said (the latest seen while it lasted)."""
    stalled_s: float
    """How long no iteration completed (so far, while it lasts)."""
    resumed: bool
    """The job went on: an iteration completed after it."""
    confirmed: bool = False
    """Its iteration is the one whose analysis took the stall's time."""

    @property
    def silent(self) -> tuple[Holder, ...]:
        """The holders that went unheard."""
        return tuple(h for h in self.holders if h.silent_s)


@dataclass(frozen=True, slots=True)
class Restart:
    rank: int
    old_pid: int
    new_pid: int
    iteration: int | None
    """The iteration it went back to, once known; None while the new process has sent none yet."""
    at_ns: int = dataclasses.field(default=0, compare=False)
    """Monitor time of the restart."""


@dataclass(frozen=True, slots=True)
class LivenessView:
    """What the screen shows of liveness, at one instant."""

    stalled_s: float = 0.0
    """How long no iteration has completed, when that is a stall; 0 otherwise."""
    silent: tuple[tuple[int, float, str], ...] = ()
    """(rank, seconds silent, last task) of the silent ranks."""
    waiting: Waiting = ()
    """Where the ranks heard from, not gone and not holding the job are."""
    holders: tuple[Holder, ...] = ()
    """While stalled, the ranks holding the job (:class:`Holder`)."""
    gone: tuple[tuple[int, str], ...] = ()
    """(rank, why): ``said bye`` (only while other ranks go on), ``process gone``."""
    restarted: tuple[Restart, ...] = ()
    """The latest restart of each rank restarted within :data:`~dagtop.model.liveness.RESTART_SHOWN_S`."""
    unheard_s: float = 0.0
    """How long nothing has come from any rank, when every rank is silent and nothing says the job stalled."""

    def line(self) -> str:
        """One line for the screen: empty while all is well."""
        parts = []
        if self.unheard_s:
            parts.append(f"nothing heard from any rank for {self.unheard_s:.0f} s (the job, or the way to it, is down)")
        if self.stalled_s:
            groups: dict[tuple[bool, str], tuple[list[int], list[Holder]]] = {}
            for h in self.holders:
                ranks, held = groups.setdefault((bool(h.silent_s), h.task), ([], []))
                ranks.append(h.rank)
                held.append(h)
            for ranks, held in groups.values():
                longest = max(held, key=lambda h: (h.silent_s, h.open_s))
                verb = "holds" if len(ranks) == 1 else "hold"
                parts.append(f"{ranks_text(ranks)} {verb} the job: {longest.describe()}")
            parts += [f"{ranks_text(list(ranks))} {where(task)}" for task, ranks in self.waiting]
            if not self.holders:
                parts.insert(0, f"no iteration for {self.stalled_s:.0f} s")
        parts += [f"{ranks_text([rank])} gone ({why})" for rank, why in self.gone]
        if len(self.restarted) == 1:
            r = self.restarted[0]
            parts.append(f"rank {r.rank} restarted (pid {r.old_pid} → {r.new_pid}"
                         + (f", iteration {r.iteration})" if r.iteration is not None else ")"))
        elif self.restarted:
            parts.append(f"{ranks_text([r.rank for r in self.restarted])} restarted (new pids)")
        return " · ".join(parts)


def where(task: str) -> str:
    """``waiting in all-reduce bucket 7`` for an open task; ``after optimizer.step`` when none is open."""
    if not task:
        return "heard from, no task known"
    if state_of(task) in _WORKING:
        return f"waiting in {task}"
    return task


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-2, 4-7``."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return "ranks " + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
