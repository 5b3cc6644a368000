"""Admission: which frames the monitor takes in, from which job and process, and what it knows of each sender.

Shared by the live screen, ``report`` (through :class:`~dagtop.model.pipeline.Pipeline`) and ``record``, so that
all three judge the jobs, runs, ranks, world sizes and byes alike.

**Senders.** Every frame names the process that sent it (``sender``, a number the shim picks when it attaches;
0 from older shims, whose frames are told apart by rank alone). Sequence numbers, iteration numbers, losses and
byes are kept per sender, so nothing one sender claims changes what the monitor holds of another.

**One job.** The monitor follows the job of the first hello it takes (its identity: torchrun's run id and where
the ranks meet, :func:`job_key`). A hello of another job is refused, with every frame of its sender, and counted
(:attr:`Admission.other_jobs`): the screen says a second job publishes here. Once the followed job has ended
(every rank said bye) or has been silent for :data:`JOB_QUIET_S`, the next job's hello is followed instead.

**Runs.** A job restarted (torchrun's restart count up, or a new process for a rank whose old one started
earlier) is a new *run*: the old run's iterations are kept and the new one's are followed. Each rank counts its
iterations from 0, so a run's iterations are numbered on from the last one of the runs before it (:attr:`Run.base`):
an iteration number is the job's, unique across runs, everywhere past admission. A process older than the one a
rank has now (a leftover of an earlier run) is refused.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from dagtop.recording import RawFrame
from instrument import wire

HOLD_LIMIT = 100_000
"""Frames kept while their sender has not said hello yet (or, from older shims, while no hello has told the world
size); beyond this they are rejected."""
HOLD_BYTES = 64 * 1024 * 1024
"""Bytes of those held frames, at most (a few large frames must not hold the monitor's memory hostage)."""
MAX_WORLD = 16_384
"""The largest world size the monitor follows: a hello claiming more is rejected. It bounds the state kept per
rank, and the work of deciding which ranks an iteration still awaits (linear in the world size)."""
MISSING_LIMIT = 100_000
"""Sequence numbers remembered as missing, all senders together, so that a frame filling a gap late is taken in;
beyond this a gap is only counted."""
REASONS_KEPT = 32
"""Distinct rejection reasons counted one by one; the rest are counted together under :data:`OTHER_REASONS`."""
OTHER_REASONS = "other reasons"
JOB_QUIET_S: Final = 5.0
"""The followed job has sent nothing for this long (five heartbeats): another job's hello is followed instead."""
SENDERS_KEPT: Final = 4 * MAX_WORLD
"""Refused senders remembered (their frames are refused without a look); past this the oldest are forgotten and
their frames held, then refused, as a stranger's."""
RUNS_KEPT: Final = 256
"""Runs kept; past this the oldest run's senders are forgotten."""
OTHER_JOBS_KEPT: Final = 16
_VALUE = re.compile(r"'[^']*'|\"[^\"]*\"|-?\d[\d_.e+-]*")
"""What varies from frame to frame in a rejection's text: quoted values and numbers."""

JobKey = tuple[str, str]
"""A job's identity as :func:`job_key` makes it: (torchrun's run id, where its ranks meet)."""


def reason_of(rejection: str) -> str:
    """A rejection's text with what varies from frame to frame taken out, so that like rejections count together:
    ``event 3: start must be a non-negative integer`` → ``event N: start must be a non-negative integer``. Short
    quoted names (field names, which the schema chooses) are kept."""
    if rejection.startswith("not msgpack"):
        return "not msgpack"
    reason = _VALUE.sub(lambda m: m[0] if m[0][0] in "'\"" and len(m[0]) <= 12 and m[0][1:-1].isidentifier()
                        else ("…" if m[0][0] in "'\"" else "N"), rejection)
    return reason[:100]


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
                else f"restart {self.restart}" if self.restart else f"run {self.number + 1} (new processes)")
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


class Admission:
    """Decodes and validates frames, places each sender in a job and a run, and keeps its state.

    Policy for awkward input (each counted, never raised):
      * a frame that does not decode: ``rejected`` with the WireError text as ``last_rejection``;
      * a hello of another job than the one followed, and every frame of its sender: rejected and counted in
        :attr:`other_jobs`; a hello of a process older than the one its rank has in the newest run: rejected;
      * a hello claiming another world size than its run's, or above MAX_WORLD: rejected;
      * a frame of a sender that has not said hello yet: held (up to HOLD_LIMIT frames and HOLD_BYTES), let
        through when its hello is taken (older shims: once any hello sizes the world, as a rank that never said
        hello is then accepted by its number);
      * a rank at or above its run's world size: rejected;
      * a frame whose (sender, seq) was seen already: ignored as a duplicate;
      * an iteration its sender's sequence numbers cannot account for (further ahead than the frames it sent or
        discarded since its previous iteration, or not after it), or past the end of its run: rejected;
      * a gap in a sender's sequence numbers: counted, by reason (:attr:`losses`).
    """

    def __init__(self, expected_ranks: int | None = None) -> None:
        self.expected_ranks = expected_ranks
        self.runs: list[Run] = []
        """The followed job's runs, oldest first; the last is followed now."""
        self.senders: dict[int, RankState] = {}
        """Sender key (its ``sender``, or −1 − rank for an older shim) → its state: placed in a run, or refused."""
        self._refused: OrderedDict[int, RankState] = OrderedDict()
        self.held: list[tuple[RawFrame, wire.Frame]] = []
        self.telemetry: dict[int, wire.Telemetry] = {}
        """Rank → its latest telemetry frame (host and GPU) in the newest run: state, kept whole, never an iteration."""
        self.other_jobs: dict[JobKey, OtherJob] = {}
        """Jobs refused because another is followed: what they sent, the newest :data:`OTHER_JOBS_KEPT`."""
        self.rejected = 0
        self.last_rejection: str | None = None
        self.rejections: dict[str, int] = {}
        """Rejections by reason (:func:`reason_of`): at most :data:`REASONS_KEPT` reasons and :data:`OTHER_REASONS`."""
        self.rejection_samples: dict[str, str] = {}
        """Reason → the first rejection's full text (cut at 200 characters)."""
        self.taken_in = 0
        """Frames taken in or held, not rejected nor duplicates: what ``record`` writes."""
        self._held_bytes = 0
        self._missing_kept = 0
        self.duplicates = 0
        self.received_ns = 0
        """Monitor clock of the newest frame taken in (0 before any)."""
        self.max_iteration = -1
        """The highest iteration number (the job's) taken in."""
        self._job_heard_ns = 0

    # ------------------------------------------------------------------ the followed job, now

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

    def current(self, frame: wire.Frame) -> bool:
        """Whether an admitted frame is of the run followed now (a late one of an earlier run is not)."""
        s = self.senders.get(frame.sender or -1 - frame.rank)
        return s is not None and s.run is not None and s.run is self.runs[-1]

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

    @property
    def dropped(self) -> int:
        """Frames lost after the monitor first heard their rank (:attr:`Losses.dropped`)."""
        return self.losses.dropped

    # ------------------------------------------------------------------ intake

    def admit(self, raw: RawFrame) -> list[tuple[RawFrame, wire.Frame]]:
        """Take one frame in; the frames it lets through, in order: itself if accepted (decoded, placed, not a
        duplicate, its iteration renumbered to the job's), then any held frames its hello releases. Never raises."""
        self.received_ns = max(self.received_ns, raw.received_ns)
        try:
            frame = wire.decode(raw.payload)
        except wire.WireError as exc:
            self.reject(str(exc))
            return []
        out: list[tuple[RawFrame, wire.Frame]] = []
        self._fold(raw, frame, out)
        return out

    def reject(self, rejection: str) -> None:
        """Count a refused frame (or an iteration that could not be analysed) under its reason."""
        self.rejected += 1
        self.last_rejection = rejection
        reason = reason_of(rejection)
        if reason not in self.rejections and len(self.rejections) >= REASONS_KEPT:
            reason = OTHER_REASONS
        self.rejections[reason] = self.rejections.get(reason, 0) + 1
        if reason not in self.rejection_samples:
            self.rejection_samples[reason] = rejection[:200]

    def _fold(self, raw: RawFrame, frame: wire.Frame, out: list[tuple[RawFrame, wire.Frame]],
              released: bool = False) -> None:
        rank = frame.rank
        key = frame.sender or -1 - rank
        s = self.senders.get(key) or self._refused.get(key)
        if isinstance(frame, wire.Hello):
            if frame.world > MAX_WORLD and self.expected_ranks is None:
                self.reject(f"world size {frame.world} is above the {MAX_WORLD} ranks this monitor follows")
                return
            if s is not None and s.rank != rank:
                self.reject(f"a process that sent as rank {s.rank} claims rank {rank}")
                return
            if s is None or (not frame.sender and frame.pid != s.pid) or s.refused:
                # A new process, or a refused one again (the job it is of may be followed now).
                s = s if s is not None and s.refused and frame.sender else RankState(rank, frame.sender)
                self._place(s, frame, raw.received_ns)
                if s.run is not None and self.held:
                    self._release_after(raw, frame, out)
                    return
        elif s is None:
            s = self._stranger(raw, frame, released)
            if s is None:
                return
        elif s.rank != rank:
            self.reject(f"a process that sent as rank {s.rank} claims rank {rank}")
            return
        if s.refused:
            self._refuse(s, raw)
            return
        run = s.run
        assert run is not None
        if rank >= run.world:
            self.reject(f"rank {rank} is not below the world size {run.world}")
            return
        missing_before = len(s.missing)
        if not _new_seq(s, frame.seq, MISSING_LIMIT - self._missing_kept):
            self.duplicates += 1
            return
        self._missing_kept += len(s.missing) - missing_before
        if isinstance(frame, wire.IterationBatch):
            why = _unaccounted(s, frame, run)
            if why:
                self.reject(why)
                return
            frame = self._iteration(s, frame, run)
        elif isinstance(frame, wire.Heartbeat) and run.base:
            frame = dataclasses.replace(frame, iteration=run.base + frame.iteration)
        if not released:
            self.taken_in += 1
        s.last_seen_ns = max(s.last_seen_ns, raw.received_ns)
        self._job_heard_ns = max(self._job_heard_ns, raw.received_ns)
        out.append((raw, frame))
        if isinstance(frame, wire.Hello):
            s.hello, s.pid = frame, frame.pid
        elif isinstance(frame, wire.Bye):
            run.byes += s.bye is None
            s.bye = frame
            s.dropped_in_band = max(s.dropped_in_band, frame.dropped)
            s.dropped_queue = max(s.dropped_queue, frame.dropped_queue)
        elif isinstance(frame, wire.Telemetry) and run is self.runs[-1]:
            self.telemetry[rank] = frame

    def _iteration(self, s: RankState, frame: wire.IterationBatch, run: Run) -> wire.IterationBatch:
        own = frame.iteration
        if own > s.own_last:
            s.own_last, s.own_last_seq, s.own_last_dropped = own, frame.seq, frame.dropped
        if s.first_iteration is None or own < s.first_iteration:
            s.first_iteration = own
        s.iteration_frames += 1
        s.dropped_in_band = max(s.dropped_in_band, frame.dropped)
        s.dropped_queue = max(s.dropped_queue, frame.dropped_queue)
        it = run.base + own
        if run.base:
            frame = dataclasses.replace(frame, iteration=it)
        if frame.events:
            s.update_end[it] = max(wire.EventColumns.of(frame.events).end_ns)
            if len(s.update_end) > 8:
                del s.update_end[min(s.update_end)]
        s.last_iteration = it if s.last_iteration is None else max(s.last_iteration, it)
        run.last_iteration = it if run.last_iteration is None else max(run.last_iteration, it)
        self.max_iteration = max(self.max_iteration, it)
        return frame

    # ------------------------------------------------------------------ senders: placed, held or refused

    def _place(self, s: RankState, hello: wire.Hello, now_ns: int) -> None:
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
        self.senders[-1 - s.rank if not s.sender else s.sender] = s
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
        self.telemetry.clear()
        self._join(s, run, hello)

    def _job_over(self, now_ns: int) -> bool:
        """Whether the followed job has ended: every rank of its newest run said bye, or none was heard for
        :data:`JOB_QUIET_S`."""
        run = self.runs[-1]
        if run.ranks and all(s.bye is not None for s in run.ranks.values()):
            return True
        return now_ns - self._job_heard_ns > JOB_QUIET_S * 1e9

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

    def _refuse(self, s: RankState, raw: RawFrame) -> None:
        self.reject(s.refused)
        if s.hello is not None and (job := self.other_jobs.get(job_key(s.hello))) is not None:
            job.frames += 1
            job.last_ns = max(job.last_ns, raw.received_ns)

    def _stranger(self, raw: RawFrame, frame: wire.Frame, released: bool) -> RankState | None:
        """The state of a sender heard of for the first time by a frame that is not a hello; None (the frame held
        or rejected) unless it is an older shim's rank that the run followed now takes by number."""
        run = self.runs[-1] if self.runs else None
        if run is None and not frame.sender and self.expected_ranks is not None and frame.rank < self.expected_ranks:
            # An older shim's rank with the world size given (--ranks): a run of no known identity, as before.
            run = Run(0, ("", ""), 0, self.expected_ranks, 0, 0, raw.received_ns)
            self.runs.append(run)
        if not frame.sender and run is not None:
            holder = run.ranks.get(frame.rank)
            if holder is not None and holder.sender:
                self.reject(f"a frame without a sender for rank {frame.rank}, whose process marks its frames")
                return None
            if frame.rank >= run.world:
                self.reject(f"rank {frame.rank} is not below the world size {run.world}")
                return None
            s = RankState(frame.rank)  # an older shim's rank that never said hello: taken by its number
            s.run = run
            run.ranks[frame.rank] = s
            self.senders[-1 - frame.rank] = s
            return s
        if frame.rank >= MAX_WORLD:
            self.reject(f"rank {frame.rank} is not below the {MAX_WORLD} ranks this monitor follows")
        elif released:
            self.held.append((raw, frame))  # still waiting: back in the queue, already counted
            self._held_bytes += len(raw.payload)
        elif len(self.held) >= HOLD_LIMIT or self._held_bytes + len(raw.payload) > HOLD_BYTES:
            self.reject("no hello yet from this process" if frame.sender else "no hello yet: the world size is unknown")
        else:
            self.held.append((raw, frame))
            self._held_bytes += len(raw.payload)
            self.taken_in += 1
        return None

    def _release_after(self, raw: RawFrame, hello: wire.Hello, out: list[tuple[RawFrame, wire.Frame]]) -> None:
        """Take a hello that placed its sender, then fold the held frames again, in order: those still without a
        place stay held. Only a sender's first placement does this (it is what can release frames)."""
        held, self.held, self._held_bytes = self.held, [], 0
        self._fold(raw, hello, out)
        for frame_raw, frame in held:
            self._fold(frame_raw, frame, out, released=True)


def rank_free(run: Run, s: RankState) -> bool:
    holder = run.ranks.get(s.rank)
    return holder is None or holder is s


def _newer(hello: wire.Hello, than: wire.Hello | None) -> bool:
    """Whether ``hello``'s process started after ``than``'s (older shims say no start: a new pid is newer)."""
    if than is None:
        return True
    if hello.started_ns and than.started_ns:
        return hello.started_ns > than.started_ns
    return hello.pid != than.pid


def _unaccounted(s: RankState, frame: wire.IterationBatch, run: Run) -> str:
    """Why an iteration frame cannot be its sender's next (empty if it can): a shim numbers its iterations one
    by one and spends a sequence number on each, or counts it in ``dropped``, so no iteration is further ahead of
    the previous one than the frames sent and discarded in between, and none comes twice. Nor may it fall past
    its run's end."""
    own, seq, dropped = frame.iteration, frame.seq, frame.dropped
    if s.own_last < 0:
        if own > seq + dropped:
            return (f"rank {frame.rank}'s first iteration {own} is beyond what its sequence number {seq} and "
                    f"{dropped} discarded frames allow")
    elif seq > s.own_last_seq:
        allowed = seq - s.own_last_seq + max(0, dropped - s.own_last_dropped)
        if not 0 < own - s.own_last <= allowed:
            return (f"rank {frame.rank}'s iteration {own} does not follow its iteration {s.own_last} within the "
                    f"{allowed} frames it sent or discarded since")
    elif own >= s.own_last:
        return f"rank {frame.rank}'s iteration {own} came with an earlier sequence number than its iteration {s.own_last}"
    if run.end is not None and run.base + own >= run.end:
        return f"rank {frame.rank}'s iteration {own} came after its run had ended (a restart followed)"
    return ""


def _new_seq(state: RankState, seq: int, room: int) -> bool:
    """Whether ``seq`` is news from the sender (a first sighting, or a gap filled late); counts the gaps it opens,
    and remembers them as missing if they fit in ``room`` (and in 10 000 for the sender)."""
    if seq > state.max_seq:
        if state.max_seq >= 0 and seq > state.max_seq + 1:
            gap = range(state.max_seq + 1, seq)
            state.gaps += len(gap)
            if len(gap) <= room and len(state.missing) + len(gap) <= 10_000:
                state.missing.update(gap)
        if state.first_seq < 0:
            state.first_seq = seq
        state.max_seq = seq
        return True
    if seq in state.missing:
        state.missing.discard(seq)
        state.gaps -= 1
        return True
    return False
