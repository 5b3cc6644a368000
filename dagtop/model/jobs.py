"""The jobs a monitor hears: the one it follows, that job's runs (one per incarnation), and each process publishing.

**Senders.** Every frame names the process that sent it (``sender``, a number the shim picks when it attaches;
0 from older shims, whose frames are told apart by rank alone). :class:`RankState` is one such process: its
sequence numbers, iterations, losses and bye, kept apart from every other's.

**One job.** The monitor follows the job of the first hello it takes (its identity: torchrun's run id and where
the ranks meet, :func:`job_key`). A hello of another job is refused, with every frame of its sender, and counted
(:attr:`Jobs.other_jobs`): the screen says a second job publishes here. Once the followed job has ended (every
rank of its newest run said bye) or has been silent for :data:`JOB_QUIET_S`, the next job's hello is followed.

**Runs.** A job restarted (torchrun's restart count up, or a new process for a rank whose process started
earlier) is a new *run*: the old run's iterations are kept and the new one's are followed. Each rank counts its
iterations from 0, so a run's iterations are numbered on from the last one of the runs before it (:attr:`Run.base`):
past admission, an iteration number is the job's, unique across runs. A process older than the one its rank has
now (a leftover of an earlier run) is refused.

:class:`Jobs` holds these rules (:meth:`Jobs.place`); :class:`~dagtop.model.admission.Admission` asks it where each
sender belongs and keeps the frames' own checks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from instrument import wire

MAX_WORLD: Final = 16_384
"""The largest world size the monitor follows: a hello claiming more is rejected. It bounds the state kept per
rank, and the work of deciding which ranks an iteration still awaits (linear in the world size)."""
JOB_QUIET_S: Final = 5.0
"""The followed job has sent nothing for this long (five heartbeats): another job's hello is followed instead."""
SENDERS_KEPT: Final = 4 * MAX_WORLD
"""Refused senders remembered (their frames are refused without a look); past this the oldest are forgotten and
their frames held, then refused, as a stranger's."""
RUNS_KEPT: Final = 256
"""Runs kept; past this the oldest run's senders are forgotten."""
OTHER_JOBS_KEPT: Final = 16

JobKey = tuple[str, str]
"""A job's identity as :func:`job_key` makes it: (torchrun's run id, where its ranks meet)."""


def job_key(hello: wire.Hello) -> JobKey:
    """Which job a hello belongs to: torchrun's run id and ``MASTER_ADDR:MASTER_PORT``. A loopback or missing
    address is this host's only, so it is qualified by the host; an older shim's hello says neither (all of them
    are then one job, as before)."""
    if not hello.sender:
        return ("", "")
    master = hello.master
    address = master.rpartition(":")[0].strip("[]") if master else ""
    if address in ("", "localhost", "::1") or address.startswith("127."):
        master = f"{hello.host}/{master}"
    return (hello.job, master)


def describe_job(key: JobKey) -> str:
    """``run id 4f2a, master node1:29500`` (the parts known)."""
    run_id, master = key
    parts = ([f"run id {run_id}"] if run_id else []) + ([f"master {master}"] if master else [])
    return ", ".join(parts) or "an older shim's, which says none"


@dataclass(slots=True)
class RankState:
    """One process publishing as one rank (a *sender*): its stream of frames and what it has said."""

    rank: int = 0
    sender: int = 0
    """Its ``sender`` number; 0 for an older shim's process (told apart by rank and pid only)."""
    hello: wire.Hello | None = None
    pid: int | None = None
    run: Run | None = None
    """The run it belongs to; None while refused, or until its hello."""
    refused: str = ""
    """Why its frames are refused (another job, an earlier process); empty if they are not."""
    first_seq: int = -1
    max_seq: int = -1
    missing: set[int] = field(default_factory=set)
    gaps: int = 0
    """Sequence numbers never received between the first one and the latest (still missing)."""
    dropped_in_band: int = 0
    """The rank's own count of frames it discarded (``dropped``), as of its latest frame."""
    dropped_queue: int = 0
    """Of those, the ones its training thread discarded (publisher queue full)."""
    first_iteration: int | None = None
    """Its first iteration that came, in its own numbering: the ones before it never came (before connect)."""
    last_iteration: int | None = None
    """Its latest iteration that came, in the job's numbering."""
    iteration_frames: int = 0
    last_seen_ns: int = 0
    bye: wire.Bye | None = None
    update_end: dict[int, int] = field(default_factory=dict)
    """Iteration (the job's numbering) → end of its last task on the rank's own clock."""
    own_last: int = -1
    """Its latest iteration in its own numbering, and that frame's seq and dropped: what bounds the next one."""
    own_last_seq: int = -1
    own_last_dropped: int = 0


@dataclass(slots=True)
class Run:
    """One incarnation of the followed job: its ranks' processes, and the numbers its iterations take."""

    number: int
    job: JobKey
    restart: int
    """torchrun's restart count as its hellos say (0 outside torchrun)."""
    world: int
    base: int
    """The job's number of this run's iteration 0."""
    started_ns: int
    """Wall clock (ns) when its first process attached, as that process said; its hello's time for older shims."""
    opened_ns: int
    """Monitor time of the hello that opened it."""
    after: int | None = None
    """The last iteration of the runs before it, when it opened (None for the first, or if none came)."""
    new_job: bool = False
    """Opened by another job's hello, once the job followed before had ended."""
    end: int | None = None
    """The first number not its own (the next run's base); None for the newest run."""
    last_iteration: int | None = None
    ranks: dict[int, RankState] = field(default_factory=dict)
    """Rank → its process in this run."""
    telemetry: dict[int, wire.Telemetry] = field(default_factory=dict)
    """Rank → its latest telemetry frame (host and GPU): state, kept whole, never an iteration."""
    byes: int = 0
    """Its ranks that said bye."""


@dataclass(frozen=True, slots=True)
class Losses:
    """What never arrived, by reason, over every sender (figures from the ranks' sequence numbers and counters)."""

    queue: int = 0
    """Iteration frames the ranks' training threads discarded (the publisher's queue was full)."""
    socket: int = 0
    """Frames the ranks' sockets refused (the monitor or the link not keeping up), oversized frames, and iterations
    a closing rank did not wait for."""
    transit: int = 0
    """Frames sent and never received: lost on the way, or sent while the monitor was unreachable."""
    before_connect: int = 0
    """Iteration frames sent before the monitor first heard their rank (its first iterations, when the connection
    was not up yet or the monitor started later)."""
    iterations: int = 0
    """Iteration frames missing after the first one of their sender came (any reason above but before_connect),
    and, in a run that has ended, those of iterations its other ranks ran whose frame from a rank never came (a
    process killed with frames still queued)."""

    @property
    def dropped(self) -> int:
        """Frames lost after the monitor first heard their rank: at the rank, or on the way."""
        return self.queue + self.socket + self.transit


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run of the followed job, as the screen and ``report`` say it (:meth:`Admission.run_infos`)."""

    number: int
    """0 for the first run the monitor saw, then 1, 2, …"""
    restart: int
    """torchrun's restart count (0 outside torchrun)."""
    run_id: str
    master: str
    world: int
    first_iteration: int
    """Its iteration 0, in the job's numbering."""
    last_iteration: int | None
    started_ns: int
    """Wall clock (ns) when its first process attached."""
    after: int | None
    """The last iteration before it (None for the first run)."""
    new_job: bool
    """Another job than the runs before it (those had ended)."""
    pids: tuple[int, ...]
    """Its ranks' processes, by rank, as far as their hellos came."""

    def line(self) -> str:
        """``restart 1 at 14:02:11, after iteration 1314`` (what the screen and the text report say)."""
        what = (f"another job ({describe_job((self.run_id, self.master))})" if self.new_job
                else f"restart {self.restart}" if self.restart else f"run {self.number + 1} (new processes)"
                if self.number else "first run")
        at = time.strftime("%H:%M:%S", time.localtime(self.started_ns / 1e9)) if self.started_ns else "?"
        after = f", after iteration {self.after}" if self.after is not None else ""
        return f"{what} at {at}{after}"


@dataclass(slots=True)
class OtherJob:
    """A job the monitor does not follow, publishing on its endpoint."""

    key: JobKey
    frames: int = 0
    last_ns: int = 0
    ranks: set[int] = field(default_factory=set)


class Jobs:
    """The followed job's runs, the processes in them, and the jobs refused: the rules of the module's docstring.

    Args:
        expected_ranks: the world size given (``--ranks``): every run's, whatever the hellos say.
    """

    def __init__(self, expected_ranks: int | None = None) -> None:
        self.expected_ranks = expected_ranks
        self.runs: list[Run] = []
        """The followed job's runs, oldest first; the last is followed now."""
        self.senders: dict[int, RankState] = {}
        """Sender key (:func:`sender_key`) → its state, for the processes placed in a run."""
        self._refused: OrderedDict[int, RankState] = OrderedDict()
        self.other_jobs: dict[JobKey, OtherJob] = {}
        """Jobs refused because another is followed: what they sent, the newest :data:`OTHER_JOBS_KEPT`."""
        self.max_iteration = -1
        """The highest iteration number (the job's) taken in."""
        self.heard_ns = 0
        """Monitor clock of the newest frame taken in from the followed job."""

    def find(self, key: int) -> RankState | None:
        """The process of this sender key, placed or refused; None for a stranger."""
        return self.senders.get(key) or self._refused.get(key)

    @property
    def run(self) -> Run | None:
        """The run followed now: the newest."""
        return self.runs[-1] if self.runs else None

    @property
    def world(self) -> int | None:
        """The world size of the run followed now: ``expected_ranks``, else its hellos' (None before any)."""
        return self.runs[-1].world if self.runs else self.expected_ranks

    @property
    def ranks(self) -> dict[int, RankState]:
        """Rank → its process in the run followed now."""
        return self.runs[-1].ranks if self.runs else {}

    def run_infos(self) -> tuple[RunInfo, ...]:
        """The runs, oldest first, as the screen and ``report`` say them."""
        return tuple(RunInfo(r.number, r.restart, r.job[0], r.job[1], r.world, r.base, r.last_iteration,
                             r.started_ns, r.after, r.new_job,
                             tuple(s.pid or 0 for _, s in sorted(r.ranks.items())))
                     for r in self.runs)

    def current(self, frame: wire.Frame) -> RankState | None:
        """The process of an admitted frame if it is of the run followed now (a late one of an earlier run is not)."""
        s = self.senders.get(sender_key(frame))
        return s if s is not None and s.run is not None and s.run is self.runs[-1] else None

    def other_jobs_heard(self, now_ns: int, within_s: float) -> list[OtherJob]:
        """The other jobs heard from within ``within_s`` of ``now_ns`` (monitor clock)."""
        return [j for j in self.other_jobs.values() if now_ns - j.last_ns <= within_s * 1e9]

    def run_of(self, iteration: int) -> Run | None:
        """The run an iteration number (the job's) belongs to; None before any run."""
        for run in reversed(self.runs):
            if iteration >= run.base:
                return run
        return self.runs[0] if self.runs else None

    @property
    def losses(self) -> Losses:
        """What never arrived, by reason, over every sender taken in."""
        queue = socket = transit = before = iterations = 0
        for s in (s for run in self.runs for s in run.ranks.values()):
            queue += s.dropped_queue
            refused = s.dropped_in_band - s.dropped_queue
            socket += refused
            transit += max(0, s.gaps - refused)
            if s.first_iteration is not None and s.last_iteration is not None and s.run is not None:
                before += s.first_iteration
                # Its iterations from the first that came to the last it ran: its bye says how many; without one,
                # in a run that ended, as far as the run went; else as far as it sent.
                last = (s.run.base + s.bye.iterations - 1 if s.bye is not None else
                        s.run.last_iteration or s.last_iteration if s.run.end is not None else s.last_iteration)
                iterations += max(0, last - (s.run.base + s.first_iteration) + 1 - s.iteration_frames)
        return Losses(queue, socket, transit, before, iterations)

    def unnamed(self, world: int, now_ns: int) -> Run:
        """The first run, of no known identity: for an older shim's ranks when the world size was given
        (``--ranks``) before any hello."""
        run = Run(0, ("", ""), 0, world, 0, 0, now_ns)
        self.runs.append(run)
        return run

    def adopt(self, frame: wire.Frame, run: Run) -> RankState:
        """An older shim's rank that never said hello, taken into ``run`` by its number."""
        s = RankState(frame.rank)
        s.run = run
        run.ranks[frame.rank] = s
        self.senders[sender_key(frame)] = s
        return s

    def place(self, s: RankState, hello: wire.Hello, now_ns: int) -> None:
        """Put a sender that said hello in a run of the followed job (opening one if it starts a run), or refuse it."""
        key = job_key(hello)
        s.hello, s.pid, s.refused = hello, hello.pid, ""
        current = self.runs[-1] if self.runs else None
        if current is None or (key != current.job and self._job_over(now_ns)):
            self._open(s, hello, key, now_ns)
            return
        if key != current.job:
            return self._refused_as(s, "a frame of another job than the one followed", key, now_ns)
        if hello.restart > current.restart:
            self._open(s, hello, key, now_ns)
            return
        if hello.restart < current.restart:
            if all(_newer(hello, x.hello, unknown=False) for x in current.ranks.values()):
                self._open(s, hello, key, now_ns)  # started after all of them: the job launched again, counting anew
                return
            for run in reversed(self.runs):  # a process of an earlier run heard late: its own run takes it
                if run.job == key and run.restart == hello.restart and rank_free(run, s):
                    return self._join(s, run, hello)
            return self._refused_as(s, "a process of an earlier run of the job (a lower restart count)")
        holder = current.ranks.get(s.rank)
        if holder is not None and s.sender and not holder.sender and holder.hello is None:
            # Frames without a sender came for this rank before its process said hello: that process takes the
            # rank, and from now on such frames are refused (they may have been a stranger's).
            del current.ranks[s.rank]
            self.senders.pop(-1 - s.rank, None)
            holder = None
        if holder is None or holder is s:
            return self._join(s, current, hello)
        if _newer(hello, holder.hello):
            self._open(s, hello, key, now_ns)
            return
        self._refused_as(s, "an earlier process of a rank whose newer process is followed")

    def _join(self, s: RankState, run: Run, hello: wire.Hello) -> None:
        if self.expected_ranks is None and hello.world != run.world:
            return self._refused_as(s, f"rank {s.rank} says world size {hello.world}; its run has {run.world} ranks")
        if self.expected_ranks is not None and s.rank >= run.world:
            return self._refused_as(s, f"rank {s.rank} is not below the world size {run.world}")
        s.run = run
        run.ranks[s.rank] = s
        self.senders[s.sender or -1 - s.rank] = s
        self._refused.pop(s.sender or -1 - s.rank, None)

    def _open(self, s: RankState, hello: wire.Hello, key: JobKey, now_ns: int) -> None:
        """A new run of the followed job (or of the next job), opened by ``s``'s hello."""
        previous = self.runs[-1] if self.runs else None
        base = self.max_iteration + 1
        if previous is not None:
            base = max(base, previous.base)
            previous.end = base
        run = Run(number=len(self.runs), job=key, restart=hello.restart, world=self.expected_ranks or hello.world,
                  base=base, started_ns=hello.started_ns or hello.wall_ns, opened_ns=now_ns,
                  after=self.max_iteration if previous is not None and self.max_iteration >= 0 else None,
                  new_job=previous is not None and key != previous.job)
        self.runs.append(run)
        self.other_jobs.pop(key, None)
        if len(self.runs) > RUNS_KEPT:
            for old in self.runs.pop(0).ranks.values():
                old.run, old.refused = None, "a process of a run too old to keep"
        self._join(s, run, hello)

    def _job_over(self, now_ns: int) -> bool:
        """Whether the followed job has ended: every rank of its newest run said bye, or none was heard for
        :data:`JOB_QUIET_S`."""
        run = self.runs[-1]
        if run.ranks and all(s.bye is not None for s in run.ranks.values()):
            return True
        return now_ns - self.heard_ns > JOB_QUIET_S * 1e9

    def _refused_as(self, s: RankState, why: str, other: JobKey | None = None, now_ns: int = 0) -> None:
        s.run, s.refused = None, why
        key = s.sender or -1 - s.rank
        self.senders.pop(key, None)
        self._refused[key] = s
        self._refused.move_to_end(key)
        while len(self._refused) > SENDERS_KEPT:
            self._refused.popitem(last=False)
        if other is not None:
            job = self.other_jobs.setdefault(other, OtherJob(other))
            job.ranks.add(s.rank)
            job.last_ns = max(job.last_ns, now_ns)
            while len(self.other_jobs) > OTHER_JOBS_KEPT:
                del self.other_jobs[min(self.other_jobs, key=lambda k: self.other_jobs[k].last_ns)]

    def count_refused(self, s: RankState, received_ns: int) -> None:
        """One more frame refused from ``s``: counted against its job, if it is another job's."""
        if s.hello is not None and (job := self.other_jobs.get(job_key(s.hello))) is not None:
            job.frames += 1
            job.last_ns = max(job.last_ns, received_ns)


def sender_key(frame: wire.Frame) -> int:
    """The key of a frame's process: its ``sender``, or −1 − rank for an older shim's (one process per rank)."""
    return frame.sender or -1 - frame.rank


def rank_free(run: Run, s: RankState) -> bool:
    holder = run.ranks.get(s.rank)
    return holder is None or holder is s


def _newer(hello: wire.Hello, than: wire.Hello | None, unknown: bool = True) -> bool:
    """Whether ``hello``'s process started after ``than``'s. Older shims say no start: then ``unknown`` (by
    default, a new pid is taken as newer)."""
    if than is None:
        return unknown
    if hello.started_ns and than.started_ns:
        return hello.started_ns > than.started_ns
    return unknown and hello.pid != than.pid
