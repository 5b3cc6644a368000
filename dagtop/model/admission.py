"""Admission: which frames the monitor takes in, and what it holds of each process's stream of them.

Shared by the live screen, ``report`` (through :class:`~dagtop.model.pipeline.Pipeline`) and ``record``, so that
all three judge the jobs, runs, ranks, world sizes and byes alike. Which job and run a process belongs to is
:mod:`dagtop.model.jobs`'s to say; the checks of each frame against its own process's stream are here.
"""

from __future__ import annotations

import dataclasses
import re

from dagtop.model.frames import RawFrame
from dagtop.model.jobs import MAX_WORLD, Jobs, Losses, RankState, Run, sender_key
from instrument import wire

__all__ = ["HOLD_BYTES", "HOLD_LIMIT", "MAX_WORLD", "MISSING_LIMIT", "OTHER_REASONS", "REASONS_KEPT", "Admission",
           "RankState", "reason_of"]

HOLD_LIMIT = 100_000
"""Frames kept while their sender has not said hello yet (or, from older shims, while no hello has told the world
size); beyond this they are rejected."""
HOLD_BYTES = 64 * 1024 * 1024
"""Bytes of those held frames, at most (a few large frames must not hold the monitor's memory hostage)."""
MISSING_LIMIT = 100_000
"""Sequence numbers remembered as missing, all senders together, so that a frame filling a gap late is taken in;
beyond this a gap is only counted."""
REASONS_KEPT = 32
"""Distinct rejection reasons counted one by one; the rest are counted together under :data:`OTHER_REASONS`."""
OTHER_REASONS = "other reasons"
_VALUE = re.compile(r"'[^']*'|\"[^\"]*\"|-?\d[\d_.e+-]*")
"""What varies from frame to frame in a rejection's text: quoted values and numbers."""


def reason_of(rejection: str) -> str:
    """A rejection's text with what varies from frame to frame taken out, so that like rejections count together:
    ``event 3: start must be a non-negative integer`` → ``event N: start must be a non-negative integer``. Short
    quoted names (field names, which the schema chooses) are kept."""
    if rejection.startswith("not msgpack"):
        return "not msgpack"
    reason = _VALUE.sub(lambda m: m[0] if m[0][0] in "'\"" and len(m[0]) <= 12 and m[0][1:-1].isidentifier()
                        else ("…" if m[0][0] in "'\"" else "N"), rejection)
    return reason[:100]


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
        self.jobs = Jobs(expected_ranks)
        """The followed job, its runs and processes, and the jobs refused."""
        self.held: list[tuple[RawFrame, wire.Frame]] = []
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

    @property
    def world(self) -> int | None:
        """The world size of the run followed now: ``expected_ranks``, else its hellos' (None before any)."""
        return self.jobs.world

    @property
    def ranks(self) -> dict[int, RankState]:
        """Rank → its process in the run followed now."""
        return self.jobs.ranks

    @property
    def telemetry(self) -> dict[int, wire.Telemetry]:
        """Rank → its latest telemetry (host and GPU) in the run followed now."""
        run = self.jobs.run
        return run.telemetry if run is not None else {}

    def run_of(self, iteration: int) -> Run | None:
        """The run an iteration number (the job's) belongs to."""
        return self.jobs.run_of(iteration)

    @property
    def losses(self) -> Losses:
        """What never arrived, by reason (:attr:`Jobs.losses`)."""
        return self.jobs.losses

    @property
    def dropped(self) -> int:
        """Frames lost after the monitor first heard their rank (:attr:`Losses.dropped`)."""
        return self.jobs.losses.dropped

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
        s = self.jobs.find(sender_key(frame))
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
                self.jobs.place(s, frame, raw.received_ns)
                if s.run is not None and self.held:
                    self._release_after(raw, frame, out)
                    return
                if s.refused and frame.sender and self.held:
                    self._refuse_held(s)
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
        self.jobs.heard_ns = max(self.jobs.heard_ns, raw.received_ns)
        out.append((raw, frame))
        if isinstance(frame, wire.Hello):
            s.hello, s.pid = frame, frame.pid
        elif isinstance(frame, wire.Bye):
            run.byes += s.bye is None
            s.bye = frame
            s.dropped_in_band = max(s.dropped_in_band, frame.dropped)
            s.dropped_queue = max(s.dropped_queue, frame.dropped_queue)
        elif isinstance(frame, wire.Telemetry):
            run.telemetry[rank] = frame

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
        self.jobs.max_iteration = max(self.jobs.max_iteration, it)
        return frame

    # ------------------------------------------------------------------ senders: placed, held or refused

    def _refuse(self, s: RankState, raw: RawFrame) -> None:
        self.reject(s.refused)
        self.jobs.count_refused(s, raw.received_ns)

    def _stranger(self, raw: RawFrame, frame: wire.Frame, released: bool) -> RankState | None:
        """The state of a sender heard of for the first time by a frame that is not a hello; None (the frame held
        or rejected) unless it is an older shim's rank that the run followed now takes by number."""
        run = self.jobs.run
        if run is None and not frame.sender and self.expected_ranks is not None and frame.rank < self.expected_ranks:
            # An older shim's rank with the world size given (--ranks): a run of no known identity, as before.
            run = self.jobs.unnamed(self.expected_ranks, raw.received_ns)
        if not frame.sender and run is not None:
            holder = run.ranks.get(frame.rank)
            if holder is not None and holder.sender:
                self.reject(f"a frame without a sender for rank {frame.rank}, whose process marks its frames")
                return None
            if frame.rank >= run.world:
                self.reject(f"rank {frame.rank} is not below the world size {run.world}")
                return None
            return self.jobs.adopt(frame, run)  # an older shim's rank that never said hello: by its number
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

    def _refuse_held(self, s: RankState) -> None:
        """The frames held for a process whose hello was just refused: refused with it."""
        kept = [(raw, frame) for raw, frame in self.held if frame.sender != s.sender]
        for raw, _ in (x for x in self.held if x[1].sender == s.sender):
            self._refuse(s, raw)
        self.held, self._held_bytes = kept, sum(len(raw.payload) for raw, _ in kept)

    def _release_after(self, raw: RawFrame, hello: wire.Hello, out: list[tuple[RawFrame, wire.Frame]]) -> None:
        """Take a hello that placed its sender, and fold the held frames again, in order (those still without a place
        stay held). Its own frames sent before the hello go first: the hello that went before them was lost, and
        this later one has a higher sequence number (taken first, it would make theirs look like duplicates). Only
        a sender's first placement does this (it is what can release frames)."""
        held, self.held, self._held_bytes = self.held, [], 0
        key = sender_key(hello)
        earlier = [x for x in held if x[1].seq < hello.seq and sender_key(x[1]) == key]
        for frame_raw, frame in earlier:
            self._fold(frame_raw, frame, out, released=True)
        self._fold(raw, hello, out)
        for frame_raw, frame in held:
            if not (frame.seq < hello.seq and sender_key(frame) == key):
                self._fold(frame_raw, frame, out, released=True)


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
