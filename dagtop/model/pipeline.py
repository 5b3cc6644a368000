"""The one entry point of the model: raw frames in, immutable snapshots and per-iteration analyses out."""

from __future__ import annotations

import bisect
import dataclasses
import statistics
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dagtop.model import verdict
from dagtop.model.analysis import analyse
from dagtop.model.clocks import ClockAligner
from dagtop.model.snapshot import IterationAnalysis, RankInfo, Snapshot
from dagtop.model.whatif import CommFit
from dagtop.recording import RawFrame
from instrument import wire

HOLD_LIMIT = 100_000
"""Iteration frames kept while no hello has told the world size yet; beyond this they are rejected."""
TASK_BUDGET = 2_000_000
"""Tasks kept across the retained analyses; past it the oldest analyses give up their ``tasks`` (memory)."""
_REMEMBERED = 4096
"""Analysed iteration numbers remembered, to recognise frames that come after their iteration was analysed."""


@dataclass(slots=True)
class _RankState:
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


class Pipeline:
    """Decodes, validates and folds frames into per-iteration analyses.

    Policy for awkward input (each counted, never raised):
      * a frame that does not decode: ``rejected`` with the WireError text as ``last_rejection``;
      * a rank at or above the world size (from ``expected_ranks`` or the ranks' hellos): rejected;
      * an iteration frame before any hello, while the world size is unknown: held (up to HOLD_LIMIT) and
        folded in once a hello says how many ranks there are; a rank that never said hello is accepted
        once the world size is known (its host is then assumed to be the reference host);
      * a frame whose (rank, seq) was seen already: ignored as a duplicate;
      * a gap in a rank's sequence numbers: counted in ``dropped``, plus the ranks' own in-band counters;
      * an iteration still missing a rank ``incomplete_after_s`` after its first frame arrived (monitor clock,
        so replays behave like the live run), or once every missing rank has moved past it or said bye:
        analysed alone with ``complete=False``. If the missing frame turns up while the iteration is still
        retained it is re-analysed; a frame for an iteration already analysed complete is rejected.
    """

    def __init__(self, window: int | None = 120, expected_ranks: int | None = None,
                 incomplete_after_s: float = 5.0) -> None:
        self.window = window
        self.expected_ranks = expected_ranks
        self.incomplete_after_ns = int(incomplete_after_s * 1e9)
        self._lock = threading.Lock()
        self._ranks: dict[int, _RankState] = {}
        self._world: int | None = expected_ranks
        self._held: list[tuple[RawFrame, wire.IterationBatch]] = []
        self._pending: dict[int, dict[int, Sequence[wire.Event]]] = {}
        self._first_received: dict[int, int] = {}
        self._analysed: OrderedDict[int, bool] = OrderedDict()
        self._partial: dict[int, dict[int, Sequence[wire.Event]]] = {}
        self._analyses: list[IterationAnalysis] = []
        self._tasks_kept = 0
        self._clocks = ClockAligner()
        self._comm = CommFit()
        self.rejected = 0
        self.last_rejection: str | None = None
        self.duplicates = 0
        self.incomplete = 0
        self._received_ns = 0
        self._finished = False
        self._snapshot: Snapshot | None = None
        self._telemetry: dict[int, wire.Telemetry] = {}
        """Rank → its latest telemetry frame (host and GPU): state, kept whole, never an iteration."""
        self._telemetry_shown: tuple[wire.Telemetry, ...] = ()

    # ------------------------------------------------------------------ feeding

    def feed(self, frames: Iterable[RawFrame]) -> None:
        """Fold frames in; analyse every iteration that became complete or was given up on. Never raises."""
        with self._lock:
            for raw in frames:
                self._received_ns = max(self._received_ns, raw.received_ns)
                try:
                    frame = wire.decode(raw.payload)
                except wire.WireError as exc:
                    self._reject(str(exc))
                    continue
                self._fold(raw, frame)
            self._settle(self._received_ns)
            self._snapshot = None

    def expire(self, now_ns: int) -> None:
        """Give up on iterations older than ``incomplete_after_s`` at monitor time ``now_ns`` (a quiet live job)."""
        with self._lock:
            self._settle(now_ns)
            self._snapshot = None

    def finish(self) -> None:
        """The source is exhausted: analyse what is pending (incomplete where a rank is missing)."""
        with self._lock:
            self._finished = True
            for it in sorted(self._pending):
                self._analyse_pending(it)
            self._snapshot = None

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        self.last_rejection = reason

    def _fold(self, raw: RawFrame, frame: wire.Frame) -> None:
        world = self._world
        if isinstance(frame, wire.Hello) and self.expected_ranks is None:
            world = max(world or 0, frame.world)
        if world is not None and frame.rank >= world:
            self._reject(f"rank {frame.rank} is not below the world size {world}")
            return
        if isinstance(frame, wire.IterationBatch) and world is None:
            if len(self._held) >= HOLD_LIMIT:
                self._reject("no hello yet: the world size is unknown")
            else:
                self._held.append((raw, frame))
            return
        state = self._ranks.setdefault(frame.rank, _RankState())
        if isinstance(frame, wire.Hello) and frame.pid != state.pid and state.pid is not None:
            # A restarted process counts from zero again.
            state.dropped_before += state.dropped_in_band
            state.dropped_in_band, state.max_seq, state.missing = 0, -1, set()
        if not self._new_seq(state, frame.seq):
            self.duplicates += 1
            return
        state.last_seen_ns = max(state.last_seen_ns, raw.received_ns)
        if isinstance(frame, wire.Hello):
            state.hello, state.pid, state.bye = frame, frame.pid, None
            self._clocks.hello(frame)
            if self.expected_ranks is None and (self._world is None or frame.world > self._world):
                self._world = frame.world
                held, self._held = self._held, []
                for held_raw, held_frame in held:
                    self._fold(held_raw, held_frame)
        elif isinstance(frame, wire.IterationBatch):
            state.dropped_in_band = max(state.dropped_in_band, frame.dropped)
            self._iteration(raw, frame, state)
        elif isinstance(frame, wire.Bye):
            state.bye = frame
            state.dropped_in_band = max(state.dropped_in_band, frame.dropped)
        elif isinstance(frame, wire.Telemetry):
            self._telemetry[frame.rank] = frame

    @staticmethod
    def _new_seq(state: _RankState, seq: int) -> bool:
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

    def _iteration(self, raw: RawFrame, frame: wire.IterationBatch, state: _RankState) -> None:
        it, r = frame.iteration, frame.rank
        if frame.events:
            state.update_end[it] = max(wire.EventColumns.of(frame.events).end_ns)
            if len(state.update_end) > 8:
                del state.update_end[min(state.update_end)]
        state.last_iteration = it if state.last_iteration is None else max(state.last_iteration, it)
        if it in self._partial:
            self._partial[it][r] = frame.events
            self._reanalyse(it)
            return
        if it in self._analysed:
            self._reject(f"iteration {it} of rank {r} came after the iteration was analysed")
            return
        self._pending.setdefault(it, {})[r] = frame.events
        self._first_received.setdefault(it, raw.received_ns)

    # ------------------------------------------------------------------ analysing

    def _expected(self, it: int) -> set[int]:
        world = self._world or 0
        return {r for r in range(world) if not ((b := self._ranks.get(r)) and b.bye and b.bye.iterations <= it)}

    def _settle(self, now_ns: int) -> None:
        for it in sorted(self._pending):
            have = self._pending[it]
            missing = self._expected(it) - have.keys()
            gone = all(
                (s := self._ranks.get(r)) is not None and s.last_iteration is not None and s.last_iteration > it
                for r in missing
            )
            if not missing or gone or now_ns - self._first_received[it] > self.incomplete_after_ns:
                self._analyse_pending(it)

    def _analyse_pending(self, it: int) -> None:
        events = self._pending.pop(it)
        self._first_received.pop(it, None)
        complete = not (self._expected(it) - events.keys())
        analysis = self._analyse(it, events, complete)
        if analysis is None:
            return
        if not complete:
            self.incomplete += 1
            self._partial[it] = dict(events)
        self._remember(it)
        self._insert(analysis)

    def _reanalyse(self, it: int) -> None:
        events = self._partial[it]
        complete = not (self._expected(it) - events.keys())
        analysis = self._analyse(it, events, complete)
        if analysis is None:
            return
        i = next((i for i, a in enumerate(self._analyses) if a.iteration == it), None)
        if i is not None:
            self._tasks_kept -= len(self._analyses[i].tasks)
            del self._analyses[i]
        if complete:
            self.incomplete -= 1
            del self._partial[it]
        self._insert(analysis)

    def _analyse(self, it: int, events: dict[int, Sequence[wire.Event]], complete: bool) -> IterationAnalysis | None:
        ranks = [r for r in events if events[r]]
        if not ranks:
            return None
        self._clocks.observe(events)
        offsets = self._clocks.offsets(ranks)
        previous = {r: end + offsets[r] for r in ranks
                    if (end := self._ranks[r].update_end.get(it - 1)) is not None}
        try:
            analysis = analyse(it, events, offsets, previous, complete, self._comm.model())
        except Exception as exc:  # noqa: BLE001 - a model bug must not take the monitor down
            self._reject(f"iteration {it} could not be analysed: {type(exc).__name__}: {exc}")
            return None
        if it > 0:  # iteration 0 runs before DDP rebuilds its buckets: keep it out of the fit
            for c in analysis.collectives:
                self._comm.add(len(analysis.ranks), c.bytes, (c.end_ns - c.start_ns) / 1e9)
        return analysis

    def _remember(self, it: int) -> None:
        self._analysed[it] = True
        while len(self._analysed) > _REMEMBERED:
            old, _ = self._analysed.popitem(last=False)
            self._partial.pop(old, None)

    def _insert(self, analysis: IterationAnalysis) -> None:
        keys = [a.iteration for a in self._analyses]
        at = bisect.bisect(keys, analysis.iteration)
        self._analyses.insert(at, analysis)
        self._tasks_kept += len(analysis.tasks)
        # The steady verdict of this iteration and of any after it (a late re-analysis) follows from the one before.
        self._analyses[at:] = verdict.fold(self._analyses, at)
        if self.window is not None:
            while len(self._analyses) > self.window:
                old = self._analyses.pop(0)
                self._tasks_kept -= len(old.tasks)
                self._partial.pop(old.iteration, None)
        i = 0
        while self._tasks_kept > TASK_BUDGET and i < len(self._analyses) - 1:
            a = self._analyses[i]
            if a.tasks:
                self._tasks_kept -= len(a.tasks)
                self._analyses[i] = dataclasses.replace(a, tasks=())
            i += 1

    # ------------------------------------------------------------------ reading

    def analyses(self) -> list[IterationAnalysis]:
        """All retained analyses, oldest first."""
        with self._lock:
            return list(self._analyses)

    @property
    def dropped(self) -> int:
        return sum(s.gaps + s.dropped_before + s.dropped_in_band for s in self._ranks.values())

    def snapshot(self) -> Snapshot:
        """The current state; built once per change and cached, so polling it is cheap."""
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._build_snapshot()
            return self._snapshot

    def _build_snapshot(self) -> Snapshot:
        recent = [a.measured_ms for a in self._analyses[-10:] if a.complete and a.measured_ms > 0]
        notes = list(self._clocks.notes())
        if self._held:
            notes.append(f"{len(self._held)} frames held until a hello says how many ranks there are")
        return Snapshot(
            iterations=tuple(self._analyses),
            ranks=tuple(self._rank_info(r, s) for r, s in sorted(self._ranks.items())),
            ranks_expected=self._world or 0,
            iterations_per_s=1000.0 / statistics.median(recent) if recent else 0.0,
            dropped=self.dropped,
            rejected=self.rejected,
            last_rejection=self.last_rejection,
            incomplete=self.incomplete,
            received_ns=self._received_ns,
            finished=self._finished,
            notes=tuple(notes),
            telemetry=self._latest_telemetry(),
        )

    def _latest_telemetry(self) -> tuple[wire.Telemetry, ...]:
        """Every rank's latest telemetry by host then rank; the same tuple until one changes (the panel redraws
        on a new one)."""
        latest = tuple(sorted(self._telemetry.values(), key=lambda t: (t.host, t.rank)))
        if latest != self._telemetry_shown:
            self._telemetry_shown = latest
        return self._telemetry_shown

    def _rank_info(self, rank: int, s: _RankState) -> RankInfo:
        h = s.hello
        return RankInfo(
            rank=rank,
            host=h.host if h else "?",
            pid=h.pid if h else 0,
            device=h.device if h else "?",
            model=h.model if h else "?",
            params=h.params if h else 0,
            last_iteration=s.last_iteration,
            last_seen_ns=s.last_seen_ns,
            clock_offset_ns=self._clocks.offset(rank),
            connected=s.bye is None and not self._finished,
        )
