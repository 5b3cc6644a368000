"""Admission: which frames the monitor takes in, and what it knows about each rank's stream of them.

Shared by the live screen, ``report`` (through :class:`~dagtop.model.pipeline.Pipeline`) and ``record``, so that
all three judge the ranks, the world size and the byes alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dagtop.recording import RawFrame
from instrument import wire

HOLD_LIMIT = 100_000
"""Iteration frames kept while no hello has told the world size yet; beyond this they are rejected."""
HOLD_BYTES = 64 * 1024 * 1024
"""Bytes of those held frames, at most (a few large frames must not hold the monitor's memory hostage)."""
MAX_WORLD = 16_384
"""The largest world size the monitor follows: a hello claiming more is rejected. It bounds the state kept per
rank, and the work of deciding which ranks an iteration still awaits (linear in the world size)."""
MISSING_LIMIT = 100_000
"""Sequence numbers remembered as missing, all ranks together, so that a frame filling a gap late is taken in;
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
      * an iteration frame before any hello, while the world size is unknown: held (up to HOLD_LIMIT frames
        and HOLD_BYTES) and let through once a hello says how many ranks there are; a rank that never said
        hello is accepted once the world size is known (its host is then assumed to be the reference host);
      * a hello claiming a world above MAX_WORLD, or any frame of a rank at or above it: rejected;
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

    @property
    def dropped(self) -> int:
        """Events or frames lost: gaps in the sequence numbers plus the ranks' in-band counters."""
        return sum(s.gaps + s.dropped_before + s.dropped_in_band for s in self.ranks.values())

    def _fold(self, raw: RawFrame, frame: wire.Frame, out: list[tuple[RawFrame, wire.Frame]],
              released: bool = False) -> None:
        world = self.world
        if isinstance(frame, wire.Hello) and self.expected_ranks is None:
            if frame.world > MAX_WORLD:
                self.reject(f"world size {frame.world} is above the {MAX_WORLD} ranks this monitor follows")
                return
            world = max(world or 0, frame.world)
        if world is not None and frame.rank >= world:
            self.reject(f"rank {frame.rank} is not below the world size {world}")
            return
        if world is None and frame.rank >= MAX_WORLD:
            self.reject(f"rank {frame.rank} is not below the {MAX_WORLD} ranks this monitor follows")
            return
        if isinstance(frame, wire.IterationBatch) and world is None:
            if len(self.held) >= HOLD_LIMIT or self._held_bytes + len(raw.payload) > HOLD_BYTES:
                self.reject("no hello yet: the world size is unknown")
            else:
                self.held.append((raw, frame))
                self._held_bytes += len(raw.payload)
                self.taken_in += 1
            return
        state = self.ranks.setdefault(frame.rank, RankState())
        if isinstance(frame, wire.Hello) and frame.pid != state.pid and state.pid is not None:
            # A restarted process counts from zero again.
            state.dropped_before += state.dropped_in_band
            self._missing_kept -= len(state.missing)
            state.dropped_in_band, state.max_seq, state.missing = 0, -1, set()
        missing_before = len(state.missing)
        if not _new_seq(state, frame.seq, MISSING_LIMIT - self._missing_kept):
            self.duplicates += 1
            return
        self._missing_kept += len(state.missing) - missing_before
        if not released:
            self.taken_in += 1
        state.last_seen_ns = max(state.last_seen_ns, raw.received_ns)
        out.append((raw, frame))
        if isinstance(frame, wire.Hello):
            state.hello, state.pid, state.bye = frame, frame.pid, None
            if self.expected_ranks is None and (self.world is None or frame.world > self.world):
                self.world = frame.world
                held, self.held, self._held_bytes = self.held, [], 0
                for held_raw, held_frame in held:
                    self._fold(held_raw, held_frame, out, released=True)
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


def _new_seq(state: RankState, seq: int, room: int) -> bool:
    """Whether ``seq`` is news from the rank (a first sighting, or a gap filled late); counts the gaps it opens,
    and remembers them as missing if they fit in ``room`` (and in 10 000 for the rank)."""
    if seq > state.max_seq:
        if state.max_seq >= 0 and seq > state.max_seq + 1:
            gap = range(state.max_seq + 1, seq)
            state.gaps += len(gap)
            if len(gap) <= room and len(state.missing) + len(gap) <= 10_000:
                state.missing.update(gap)
        state.max_seq = seq
        return True
    if seq in state.missing:
        state.missing.discard(seq)
        state.gaps -= 1
        return True
    return False
