"""Admission: which frames the monitor takes in, and what it knows about each rank's stream of them.

Shared by the live screen, ``report`` (through :class:`~dagtop.model.pipeline.Pipeline`) and ``record``, so that
all three judge the ranks, the world size and the byes alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagtop.recording import RawFrame
from instrument import wire

HOLD_LIMIT = 100_000
"""Iteration frames kept while no hello has told the world size yet; beyond this they are rejected."""


@dataclass(slots=True)
class RankState:
    """What the monitor knows about one rank's stream of frames."""

    hello: wire.Hello | None = None
    pid: int | None = None
    max_seq: int = -1
    missing: set[int] = field(default_factory=set)
    gaps: int = 0
    dropped_in_band: int = 0
    dropped_before: int = 0
    """In-band drops reported by earlier processes of this rank (a restart resets the counter)."""
    last_iteration: int | None = None
    last_seen_ns: int = 0
    bye: wire.Bye | None = None
    update_end: dict[int, int] = field(default_factory=dict)
    """Iteration → end of its last task on the rank's own clock."""


class Admission:
    """Decodes and validates frames, and keeps each rank's state.

    Policy for awkward input (each counted, never raised):
      * a frame that does not decode: ``rejected`` with the WireError text as ``last_rejection``;
      * a rank at or above the world size (from ``expected_ranks`` or the ranks' hellos): rejected;
      * an iteration frame before any hello, while the world size is unknown: held (up to HOLD_LIMIT) and
        let through once a hello says how many ranks there are; a rank that never said hello is accepted
        once the world size is known (its host is then assumed to be the reference host);
      * a frame whose (rank, seq) was seen already: ignored as a duplicate;
      * a gap in a rank's sequence numbers: counted in ``dropped``, plus the ranks' own in-band counters.
    """

    def __init__(self, expected_ranks: int | None = None) -> None:
        self.expected_ranks = expected_ranks
        self.world: int | None = expected_ranks
        """The world size: ``expected_ranks``, else the largest in the hellos so far (None before any)."""
        self.ranks: dict[int, RankState] = {}
        self.held: list[tuple[RawFrame, wire.IterationBatch]] = []
        self.telemetry: dict[int, wire.Telemetry] = {}
        """Rank → its latest telemetry frame (host and GPU): state, kept whole, never an iteration."""
        self.rejected = 0
        self.last_rejection: str | None = None
        self.duplicates = 0
        self.received_ns = 0
        """Monitor clock of the newest frame taken in (0 before any)."""

    def admit(self, raw: RawFrame) -> list[tuple[RawFrame, wire.Frame]]:
        """Take one frame in; the frames it lets through, in order: itself if accepted (decoded, from a rank below
        the world size, not a duplicate), then the held iteration frames that a hello's world size releases.
        Never raises."""
        self.received_ns = max(self.received_ns, raw.received_ns)
        try:
            frame = wire.decode(raw.payload)
        except wire.WireError as exc:
            self.reject(str(exc))
            return []
        out: list[tuple[RawFrame, wire.Frame]] = []
        self._fold(raw, frame, out)
        return out

    def reject(self, reason: str) -> None:
        self.rejected += 1
        self.last_rejection = reason

    @property
    def dropped(self) -> int:
        """Events or frames lost: gaps in the sequence numbers plus the ranks' in-band counters."""
        return sum(s.gaps + s.dropped_before + s.dropped_in_band for s in self.ranks.values())

    def _fold(self, raw: RawFrame, frame: wire.Frame, out: list[tuple[RawFrame, wire.Frame]]) -> None:
        world = self.world
        if isinstance(frame, wire.Hello) and self.expected_ranks is None:
            world = max(world or 0, frame.world)
        if world is not None and frame.rank >= world:
            self.reject(f"rank {frame.rank} is not below the world size {world}")
            return
        if isinstance(frame, wire.IterationBatch) and world is None:
            if len(self.held) >= HOLD_LIMIT:
                self.reject("no hello yet: the world size is unknown")
            else:
                self.held.append((raw, frame))
            return
        state = self.ranks.setdefault(frame.rank, RankState())
        if isinstance(frame, wire.Hello) and frame.pid != state.pid and state.pid is not None:
            # A restarted process counts from zero again.
            state.dropped_before += state.dropped_in_band
            state.dropped_in_band, state.max_seq, state.missing = 0, -1, set()
        if not _new_seq(state, frame.seq):
            self.duplicates += 1
            return
        state.last_seen_ns = max(state.last_seen_ns, raw.received_ns)
        out.append((raw, frame))
        if isinstance(frame, wire.Hello):
            state.hello, state.pid, state.bye = frame, frame.pid, None
            if self.expected_ranks is None and (self.world is None or frame.world > self.world):
                self.world = frame.world
                held, self.held = self.held, []
                for held_raw, held_frame in held:
                    self._fold(held_raw, held_frame, out)
        elif isinstance(frame, wire.IterationBatch):
            state.dropped_in_band = max(state.dropped_in_band, frame.dropped)
            it = frame.iteration
            if frame.events:
                state.update_end[it] = max(wire.EventColumns.of(frame.events).end_ns)
                if len(state.update_end) > 8:
                    del state.update_end[min(state.update_end)]
            state.last_iteration = it if state.last_iteration is None else max(state.last_iteration, it)
        elif isinstance(frame, wire.Bye):
            state.bye = frame
            state.dropped_in_band = max(state.dropped_in_band, frame.dropped)
        elif isinstance(frame, wire.Telemetry):
            self.telemetry[frame.rank] = frame


def _new_seq(state: RankState, seq: int) -> bool:
    """Whether ``seq`` is news from the rank (a first sighting, or a gap filled late); counts the gaps it opens."""
    if seq > state.max_seq:
        if state.max_seq >= 0 and seq > state.max_seq + 1:
            gap = range(state.max_seq + 1, seq)
            state.gaps += len(gap)
            if len(state.missing) + len(gap) <= 10_000:
                state.missing.update(gap)
        state.max_seq = seq
        return True
    if seq in state.missing:
        state.missing.discard(seq)
        state.gaps -= 1
        return True
    return False
