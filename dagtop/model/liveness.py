"""Liveness: which ranks are silent, gone or restarted, and while the job is stalled who holds it and where the
others wait.

Silence is judged on the monitor's clock (frames' ``received_ns``) from every frame a rank sends, heartbeats above
all (``heartbeat``: the task a rank has open, about every second, sent by its publisher thread even while
training is stuck). Ranks that send no heartbeats (older shims) are judged by their hellos and telemetry, every 2 s.
Stalls are judged on the ranks' own clocks: a heartbeat says when it was sent (``mono_ns``), an iteration when
its last task ended, so frames that arrive late, or all at once after the monitor or the way to it was down, say
whether the job itself stopped. Silence of every rank at once is said as such, never as a stall.

* **stalled**: on some rank's clock, no iteration completed for :data:`STALL_FACTOR` times the median iteration
  (and at least :data:`STALL_MIN_S`), as its heartbeats tell (the monitor's clock for ranks whose heartbeats do
  not carry theirs);
* **silent**: nothing heard from a rank for :data:`SILENT_AFTER_S` (twice that without heartbeats);
* **unheard**: every rank silent: the job, or the way to it, is down (not a stall: nothing says the job stopped);
* **holder**: while stalled, a rank that keeps the others waiting: one silent, or one heard from outside any
  collective while others wait in one (``rank 1 holds the job: in loader next for 38 s · rank 0 waiting in
  all-reduce bucket 0``). A collective waits for every rank: the ranks not in it are the ones it waits for. Which
  rank is in a collective, in a task or in none, is its heartbeat's ``state`` (:class:`OpenTask`), never read from
  the task's name: an older rank's heartbeat says none, so it is never taken to wait in one;
* **gone**: the rank said bye, or its process no longer exists (looked up only when its host is this one);
* **restarted**: a known rank says hello from a new pid, or its iterations go back.

A stall is recorded once for the job, silent rank or not: the iteration that stalled, its holders and where every
other rank was, how long it lasted. The iteration is first the furthest any rank was in (a silent rank's own may
be stale); when that iteration's analysis comes (:meth:`Liveness.settle`: the one, within a step of it, that took
the stall's time) it is confirmed, and that analysis is marked stalled, out of the steady verdict. A rank silent
before its first heartbeat is placed at its last known iteration and task (the last task of its last frame).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dagtop.model.liveness_view import Holder, LivenessView, OpenTask, Restart, Stall, Waiting, heard_state, state_of
from instrument import wire
from instrument.events import EventColumns, TaskState

SILENT_AFTER_S: Final = 3.0
"""Three missed heartbeats."""
STALL_MIN_S: Final = 3.0
STALL_FACTOR: Final = 5.0
STALLS_KEPT: Final = 10_000
"""Stall records kept (a long job that stalls again and again): the oldest go first."""
RESTARTS_KEPT: Final = 1000
RESTART_SHOWN_S: Final = 60.0
"""The screen says a rank restarted for this long."""
ASSESS_EVERY_NS: Final = 500_000_000
"""The judgement is made this often at most, as frames come or the monitor's clock runs (a recording has no clock
but its frames' times): O(ranks) each time, 23 ms at 16 384 ranks."""


def pid_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (killed, not yet reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    except (OSError, OverflowError):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: existing is all we know
    return state not in ("Z", "X")


@dataclass(slots=True)
class _Rank:
    pid: int | None = None
    host: str = ""
    heard_ns: int = 0
    beat_ns: int = 0
    """When its last heartbeat came."""
    open_ms: int = 0
    """How long its task had been open, as that heartbeat said."""
    heartbeats: bool = False
    iteration: int = 0
    """The iteration under way, as the last heartbeat said, or past the last one done."""
    done: int = -1
    """The last iteration whose frame came."""
    task: str = ""
    bye: bool = False
    dead: bool = False
    clock_ns: int = 0
    """The latest time heard from it on its own clock (heartbeats, hellos, iterations' ends, telemetry)."""
    since_ns: int = 0
    """Its last progress on its own clock: its last iteration's end (or the first time heard from it)."""
    since_received_ns: int = 0
    """The same on the monitor's clock: when that iteration's frame came (or the first frame)."""
    rank_clock: bool = False
    """Its heartbeats carry its clock: its stalls are judged on it (else on the monitor's, by arrival)."""
    restart: int | None = None
    """Key of this rank's restart whose first iteration has not come yet."""


class Liveness:
    """Folds frames in (:meth:`take`), judges (:meth:`assess`) at a monitor time, and confirms each stall's iteration
    from the analyses (:meth:`settle`)."""

    def __init__(self, alive: Callable[[int], bool] = pid_alive) -> None:
        self._alive = alive
        self._host = socket.gethostname()
        self._ranks: dict[int, _Rank] = {}
        self._intervals: deque[int] = deque(maxlen=20)
        """The latest iterations' durations on their ranks' clocks (ns)."""
        self._stalls: dict[int, Stall] = {}
        self._open: int | None = None
        """Key of the stall under way, while it lasts."""
        self._open_at = -1
        """The last iteration done on every rank when it began."""
        self._restarts: dict[int, Restart] = {}
        self._numbered = 0
        self.view = LivenessView()
        self._assessed_ns = 0
        self._pids_ns = 0

    def take(self, frame: wire.Frame, received_ns: int, ended_ns: int | None = None) -> None:
        """One frame admitted from a rank, received at ``received_ns``; judges first if a judgement is due, so that
        a rank heard again after a silence is judged silent up to that frame (the replay of a recording).
        ``ended_ns``: for an iteration, the end of its last task on the rank's clock, if the caller has it already
        (else it is read from the events)."""
        self.tick(received_ns)
        r = self._ranks.setdefault(frame.rank, _Rank())
        r.heard_ns = max(r.heard_ns, received_ns)
        if isinstance(frame, wire.Hello):
            if r.pid is not None and frame.pid != r.pid:
                self._restarted(frame.rank, r, frame.pid, received_ns)
            r.pid, r.host, r.bye, r.dead = frame.pid, frame.host, False, False
            self._clock(r, frame.mono_ns, received_ns)
        elif isinstance(frame, wire.Heartbeat):
            r.heartbeats, r.iteration, r.task = True, frame.iteration, OpenTask(frame.task, heard_state(frame.state))
            r.beat_ns, r.open_ms = received_ns, frame.open_ms
            if frame.mono_ns:
                r.rank_clock = True
            self._clock(r, frame.mono_ns, received_ns)
        elif isinstance(frame, wire.IterationBatch):
            if frame.iteration < r.done and r.pid is not None:  # same pid, iterations reset: a restart in place
                self._restarted(frame.rank, r, r.pid, received_ns)
            if r.restart is not None:  # the first iteration since its restart
                if r.restart in self._restarts:
                    self._restarts[r.restart] = _replace(self._restarts[r.restart], iteration=frame.iteration)
                r.restart = None
            if ended_ns is None:
                ended_ns = max(wire.EventColumns.of(frame.events).end_ns) if frame.events else 0
            ended = ended_ns
            self._clock(r, ended, received_ns)
            if frame.iteration > r.done:
                since, now = (r.since_ns, ended) if r.rank_clock and ended else (r.since_received_ns, received_ns)
                if r.done >= 0 and now > since:
                    self._intervals.append((now - since) // (frame.iteration - r.done))
                r.since_ns, r.since_received_ns = ended or r.clock_ns, received_ns
            r.done = max(r.done, frame.iteration)
            r.iteration = max(r.iteration, frame.iteration + 1)
            if not r.heartbeats:  # no heartbeat to say where it is: after the last task it sent
                last = _last_task(frame.events)
                r.task = OpenTask(f"after {last}", TaskState.BETWEEN) if last else ""
                r.beat_ns, r.open_ms = received_ns, 0
        elif isinstance(frame, wire.Bye):
            r.bye = True
        elif isinstance(frame, wire.Telemetry):
            self._clock(r, frame.mono_ns, received_ns)

    @staticmethod
    def _clock(r: _Rank, rank_ns: int, received_ns: int) -> None:
        """Note a time heard from ``r``: ``rank_ns`` on its clock (0: not said), ``received_ns`` on the monitor's."""
        r.clock_ns = max(r.clock_ns, rank_ns)
        r.since_ns = r.since_ns or rank_ns
        r.since_received_ns = r.since_received_ns or received_ns

    def tick(self, now_ns: int, check_pids: bool = False) -> None:
        """:meth:`assess` if the last judgement is :data:`ASSESS_EVERY_NS` old, or pids are to be looked up and the
        last look is that old (frames coming all the time must not starve the look)."""
        pids = check_pids and now_ns - self._pids_ns >= ASSESS_EVERY_NS
        if pids or now_ns - self._assessed_ns >= ASSESS_EVERY_NS:
            self.assess(now_ns, pids)

    def assess(self, now_ns: int, check_pids: bool = False) -> LivenessView:
        """Judge every rank at monitor time ``now_ns``; update :attr:`stalls` and :attr:`view`. ``check_pids``:
        look up the pids of ranks on this host (a live monitor; a recording's are long gone)."""
        self._assessed_ns = now_ns
        if check_pids:
            self._pids_ns = now_ns
        ranks = self._ranks
        gone: list[tuple[int, str]] = []
        for rank, r in sorted(ranks.items()):
            if not r.bye and not r.dead and check_pids and r.pid is not None and r.host == self._host:
                r.dead = not self._alive(r.pid)
            if r.bye or r.dead:
                gone.append((rank, "said bye" if r.bye else "process gone"))
        live = {rank: r for rank, r in ranks.items() if not r.bye}
        if gone and all(why == "said bye" for _, why in gone) and not live:
            gone = []  # a job that ended: every rank said bye
        silent = [(rank, (now_ns - r.heard_ns) / 1e9, r) for rank, r in sorted(live.items())
                  if now_ns - r.heard_ns > _silent_after(r) * 1e9]
        # How long each rank has gone without an iteration, as far as what came from it tells: on its own clock
        # (up to its latest heartbeat), or on the monitor's for a rank whose heartbeats do not carry its clock.
        quiet_ns = max((r.clock_ns - r.since_ns if r.rank_clock and r.since_ns else now_ns - r.since_received_ns
                        for r in live.values() if r.since_received_ns), default=0)
        stalled = bool(live) and quiet_ns > self.threshold_s() * 1e9
        unheard = bool(live) and len(silent) == len(live) and not stalled
        holders: list[Holder] = []
        waiting: Waiting = ()
        if stalled:
            holders, waiting = self._holders(now_ns, live, silent)
            self._record(live, holders, waiting, quiet_ns / 1e9)
        elif self._open is not None and ((resumed := _done(ranks) > self._open_at) or not live):
            # Gone on: an iteration completed on every rank since it began, however many looks ago (frames that
            # come in a burst after a stall are looked at once), or ended (every rank said bye).
            if self._open in self._stalls:
                self._stalls[self._open] = _replace(self._stalls[self._open], resumed=resumed)
            self._open = None
        self.view = LivenessView(
            stalled_s=quiet_ns / 1e9 if stalled else 0.0,
            silent=tuple((rank, silent_s, r.task) for rank, silent_s, r in silent) if stalled else (),
            waiting=waiting,
            holders=tuple(holders),
            gone=tuple(gone),
            restarted=self._recent_restarts(now_ns),
            unheard_s=min(silent_s for _, silent_s, _ in silent) if unheard else 0.0,
        )
        return self.view

    def threshold_s(self) -> float:
        """How long without an iteration completed is a stall: :data:`STALL_FACTOR` median iterations, at least
        :data:`STALL_MIN_S`."""
        median = statistics.median(self._intervals) if self._intervals else 0
        return max(STALL_MIN_S, STALL_FACTOR * median / 1e9)

    def _holders(self, now_ns: int, live: dict[int, _Rank], silent: list[tuple[int, float, _Rank]]
                 ) -> tuple[list[Holder], Waiting]:
        """The ranks holding a stalled job, and where the others are: a silent rank holds it; so does a rank heard
        from outside any collective while another waits in one (a collective cannot finish without every rank)."""
        quiet = {rank for rank, _, _ in silent}
        heard = [(rank, r) for rank, r in sorted(live.items()) if not r.dead and rank not in quiet]
        in_collective = any(state_of(r.task) is TaskState.COLLECTIVE for _, r in heard)
        holders = [Holder(rank, r.task, 0.0, silent_s) for rank, silent_s, r in silent]
        if in_collective:
            holders += [Holder(rank, r.task, (r.open_ms + (now_ns - r.beat_ns) / 1e6) / 1e3)
                        for rank, r in heard if state_of(r.task) is not TaskState.COLLECTIVE]
        held = {h.rank for h in holders}
        holders.sort(key=lambda h: h.rank)
        return holders, _grouped((rank, r.task) for rank, r in heard if rank not in held)

    def _recent_restarts(self, now_ns: int) -> tuple[Restart, ...]:
        latest: dict[int, Restart] = {}
        for x in reversed(self._restarts.values()):
            if now_ns - x.at_ns > RESTART_SHOWN_S * 1e9:
                break
            latest.setdefault(x.rank, x)
        return tuple(sorted(latest.values(), key=lambda x: x.rank))

    @property
    def stalls(self) -> list[Stall]:
        """Every stall recorded (the newest :data:`STALLS_KEPT`), oldest first."""
        return list(self._stalls.values())

    @property
    def restarts(self) -> list[Restart]:
        """Every restart seen (the newest :data:`RESTARTS_KEPT`), oldest first."""
        return list(self._restarts.values())

    def settle(self, iteration: int, measured_ms: float) -> bool:
        """An iteration analysed complete, ``measured_ms`` long: whether it is a stalled one (then reported as a stall,
        out of the steady verdict). It is the iteration of a stall recorded near it (within a step: a silent rank's
        own iteration may be stale) if it took a stall's time, which confirms the stall's iteration; or, past the
        first few iterations, any iteration that long, which no frame showed while it lasted (a stall is recorded
        for it then, with no holder known)."""
        for key, stall in reversed(self._stalls.items()):
            if stall.confirmed and stall.iteration == iteration:
                return True
        long = measured_ms / 1e3 >= self.threshold_s()
        if not long:
            return False
        for key, stall in reversed(self._stalls.items()):
            if not stall.confirmed and stall.iteration - 2 <= iteration <= stall.iteration + 1:
                self._stalls[key] = _replace(stall, iteration=iteration, confirmed=True)
                return True
        if len(self._intervals) < 3:
            return False  # the first iterations: their time says nothing yet of what is normal
        self._stalls[self._number(self._stalls, STALLS_KEPT)] = Stall(iteration, (), (), round(measured_ms / 1e3, 1),
                                                                     resumed=True, confirmed=True)
        return True

    def _record(self, live: dict[int, _Rank], holders: list[Holder], waiting: Waiting, stalled_s: float) -> None:
        """Open the stall under way, or bring it up to date."""
        iteration = max((r.iteration for r in live.values()), default=0)
        if self._open is None or self._open not in self._stalls:
            self._open, self._open_at = self._number(self._stalls, STALLS_KEPT), _done(self._ranks)
            self._stalls[self._open] = Stall(iteration, tuple(holders), waiting, round(stalled_s, 1), resumed=False)
            return
        old = self._stalls[self._open]
        # Each holder as it held the job most plainly: a rank heard again as the job resumes (its heartbeat back,
        # its iteration not yet) must not turn 'silent 8 s' into 'in forward for 9 s'; where the others waited, as
        # of that look.
        kept = {h.rank: h for h in old.holders}
        for h in holders:
            if h.rank not in kept or _weight(h) > _weight(kept[h.rank]):
                kept[h.rank] = h
        longest = max(map(_weight, holders), default=(False, 0.0)) >= max(map(_weight, old.holders),
                                                                         default=(False, 0.0))
        self._stalls[self._open] = _replace(old, iteration=max(old.iteration, iteration),
                                            holders=tuple(sorted(kept.values(), key=lambda h: h.rank)),
                                            waiting=waiting if waiting and longest else old.waiting or waiting,
                                            stalled_s=round(stalled_s, 1))

    def _number(self, kept: dict[int, Any], limit: int) -> int:
        """A number for a new record in ``kept``, the oldest dropped past ``limit``."""
        if len(kept) >= limit:
            del kept[next(iter(kept))]
        self._numbered += 1
        return self._numbered

    def _restarted(self, rank: int, r: _Rank, new_pid: int, now_ns: int) -> None:
        r.restart = self._number(self._restarts, RESTARTS_KEPT)
        self._restarts[r.restart] = Restart(rank, r.pid or 0, new_pid, None, now_ns)
        r.done, r.iteration, r.task = -1, 0, ""
        r.clock_ns = r.since_ns = r.since_received_ns = 0  # a new process: a clock of its own
        self._open_at = -1  # a stall under way: the new process's first iteration resumes it


def _last_task(events: Any) -> str:
    """The name of the task that ended last among an iteration's events (empty for none)."""
    if isinstance(events, EventColumns):
        if not len(events):
            return ""
        return str(events.name[max(range(len(events)), key=events.end_ns.__getitem__)])
    return str(max(events, key=lambda e: e[5])[2]) if events else ""


def _grouped(pairs: Iterable[tuple[int, str]]) -> Waiting:
    """(rank, task) pairs, ranks ascending, as (task, ranks) by first rank."""
    by_task: dict[str, list[int]] = {}
    for rank, task in pairs:
        by_task.setdefault(task, []).append(rank)
    return tuple((task, tuple(ranks)) for task, ranks in by_task.items())


def _silent_after(r: _Rank) -> float:
    return SILENT_AFTER_S if r.heartbeats else 2 * SILENT_AFTER_S


def _replace(obj: Any, **changes: Any) -> Any:
    return dataclasses.replace(obj, **changes)


def _done(ranks: dict[int, _Rank]) -> int:
    """The last iteration done on every rank."""
    return min((r.done for r in ranks.values()), default=-1)


def _weight(h: Holder) -> tuple[bool, float]:
    """What a holder's record says: a silence (the rank could not be heard: frozen, cut off) before a task held open,
    then the longer."""
    return h.silent_s > 0, max(h.silent_s, h.open_s)
