"""Completion: when an iteration's frames are all in (or given up on), its analysis, and the window of analyses.

The rule of what "complete" means lives here, in :func:`missing`, for the live screen, ``report`` and
``record`` alike.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from dagtop.model import verdict
from dagtop.model.admission import Admission
from dagtop.model.analysis import analyse
from dagtop.model.clocks import ClockAligner
from dagtop.model.frames import RawFrame
from dagtop.model.interference import InterferenceFit
from dagtop.model.jobs import RankState
from dagtop.model.snapshot import WARM_UP, IterationAnalysis
from dagtop.model.tasks import NO_TASKS
from dagtop.model.whatif import CoHost, CommFit, cohosts, transfers
from instrument import wire

_REMEMBERED = 65_536
"""Analysed iteration numbers remembered, to recognise frames that come after their iteration was analysed."""
MAX_PENDING = 4096
"""Iterations waiting for their frames at most; past this, or past :data:`PENDING_BYTES`, the oldest is given up
on at once (a sender whose iteration numbers jump about must not grow the monitor's memory)."""
PENDING_BYTES = 256 * 1024 * 1024
"""Bytes of frames (as received) held in waiting iterations, at most."""
MAX_LATE = 65_536
LATE_BYTES = 128 * 1024 * 1024
"""Iterations given up on while a rank's frame was missing are kept, up to this many and these bytes of frames (as
received), so that a frame arriving late still completes its iteration: memory, not a fixed time, bounds how late
a frame may be (on a link that drops packets, TCP delivers some many seconds late). Past it, the oldest go."""


def _iteration(a: IterationAnalysis) -> int:
    return a.iteration


def missing(admission: Admission, iteration: int, have: Iterable[int]) -> set[int]:
    """The ranks whose frame of ``iteration`` is still awaited: every rank below the world size of the run the
    iteration belongs to that had not said bye before it (a bye counts the iterations the rank ran), less the
    ranks in ``have``.

    An iteration is complete when none is missing. The runs, world sizes and byes are the admission's, so an
    iteration complete for ``record`` is complete on the screen and in ``report``.
    """
    run = admission.run_of(iteration)
    if run is None:
        return set()
    ranks, own = run.ranks, iteration - run.base
    expected = {r for r in range(run.world) if not ((s := ranks.get(r)) and s.bye and s.bye.iterations <= own)}
    return expected.difference(have)


class Completion:
    """Holds each iteration's frames until it is complete or given up on, then analyses it into the window.

    Policy (each counted, never raised):
      * an iteration still missing a rank ``incomplete_after_ns`` after its first frame arrived (monitor clock,
        so replays behave like the live run), once every missing rank's process has moved past it (a rank's
        frames come in order: the one missing is lost) or said bye, or once a newer run has begun: analysed
        with what came, ``complete=False``. It stays open to late frames (up to MAX_LATE iterations and
        LATE_BYTES of frames): the missing frame, when it comes, completes and re-analyses it, and it is no longer
        counted incomplete. A frame for an iteration already analysed complete, or let go, is rejected;
      * past MAX_PENDING waiting iterations or PENDING_BYTES of their frames, the oldest is given up on at once;
      * past ``window`` analyses the oldest leave; past ``task_budget`` tasks across the window the oldest
        analyses give up their ``tasks`` (memory).

    Args:
        admission: whose world size, byes and ranks' clocks the rule and the analysis read; rejections are
            counted there too.
        clocks: the offsets that put every rank on one clock (fed the hellos by the caller).
    """

    def __init__(self, admission: Admission, clocks: ClockAligner, window: int | None, incomplete_after_ns: int,
                 task_budget: int, bandwidth_gbps: float | None = None,
                 stalled: Callable[[int, float], bool] | None = None) -> None:
        self.window = window
        self._stalled = stalled
        """Whether a complete iteration (its number, its ms) is a stall (:meth:`dagtop.model.liveness.Liveness.settle`)."""
        self.bandwidth_gbps = bandwidth_gbps
        """The bus bandwidth of the ``network bandwidth`` what-if, GB/s (None: twice the fitted)."""
        self.incomplete_after_ns = incomplete_after_ns
        self.task_budget = task_budget
        self.analyses: list[IterationAnalysis] = []
        """The retained analyses, oldest first."""
        self.incomplete = 0
        """Analyses given up on that are still incomplete."""
        self._admission = admission
        self._clocks = clocks
        self._pending: dict[int, dict[int, Sequence[wire.Event]]] = {}
        self._pending_bytes: dict[int, int] = {}
        self._pending_total = 0
        self._first_received: dict[int, int] = {}
        self._analysed: OrderedDict[int, bool] = OrderedDict()
        self._partial: dict[int, dict[int, Sequence[wire.Event]]] = {}
        """Iterations analysed incomplete, kept open to their late frames (their frames, by rank)."""
        self._partial_bytes: dict[int, int] = {}
        self._partial_total = 0
        self._tasks_kept = 0
        self._bare = 0
        """The analyses before this index have given up their tasks (or had none)."""
        self._comm = CommFit()
        self._interference = InterferenceFit()
        self._hellos: tuple[wire.Hello | None, ...] = ()
        self._shared: dict[int, CoHost] = {}
        """The CPU ranks sharing a host with other ranks, for the hellos in ``_hellos``."""

    def add(self, raw: RawFrame, frame: wire.IterationBatch) -> None:
        """One admitted iteration frame: pending, or a late part of an iteration already given up on."""
        it, r = frame.iteration, frame.rank
        if it in self._partial:
            self._partial[it][r] = frame.events
            self._partial_bytes[it] += len(raw.payload)
            self._partial_total += len(raw.payload)
            self._reanalyse(it)
            self._bound_partial()
            return
        if it in self._analysed:
            self._admission.reject(f"iteration {it} of rank {r} came after the monitor had let the iteration go "
                                   "(past what it keeps open to late frames)")
            return
        if it not in self._pending:
            # A new iteration begins: analyse what is complete before it now, not once the whole batch is in (a
            # recording folded at once, a replay at full speed): the ranks' previous update ends, where each
            # iteration's measured time starts, are kept for the last few iterations only.
            self.settle(raw.received_ns)
        self._pending.setdefault(it, {})[r] = frame.events
        self._first_received.setdefault(it, raw.received_ns)
        self._pending_bytes[it] = self._pending_bytes.get(it, 0) + len(raw.payload)
        self._pending_total += len(raw.payload)
        while self._pending and (len(self._pending) > MAX_PENDING or self._pending_total > PENDING_BYTES):
            self._analyse_pending(min(self._pending))

    def settle(self, now_ns: int) -> None:
        """Analyse every pending iteration that is complete, or given up on at monitor time ``now_ns``."""
        admission = self._admission
        for it in sorted(self._pending):
            absent = missing(admission, it, self._pending[it])
            run = admission.run_of(it)
            ranks = run.ranks if run is not None else {}
            gone = all(
                (s := ranks.get(r)) is not None and s.last_iteration is not None and s.last_iteration > it
                for r in absent
            )
            ended = run is not None and run.end is not None  # a newer run began: these processes are gone
            if not absent or gone or ended or now_ns - self._first_received[it] > self.incomplete_after_ns:
                self._analyse_pending(it)

    def finish(self) -> None:
        """The source is exhausted: analyse what is pending (incomplete where a rank is missing)."""
        for it in sorted(self._pending):
            self._analyse_pending(it)

    def _analyse_pending(self, it: int) -> None:
        events = self._pending.pop(it)
        self._first_received.pop(it, None)
        nbytes = self._pending_bytes.pop(it, 0)
        self._pending_total -= nbytes
        complete = not missing(self._admission, it, events)
        analysis = self._analyse(it, events, complete)
        if analysis is None:
            return
        if not complete:
            self.incomplete += 1
            self._partial[it] = dict(events)
            self._partial_bytes[it] = nbytes
            self._partial_total += nbytes
        self._remember(it)
        self._insert(analysis)
        self._bound_partial()

    def _bound_partial(self) -> None:
        """Past MAX_LATE iterations or LATE_BYTES kept open to late frames, the oldest are let go (the least likely
        to get one)."""
        while self._partial and (len(self._partial) > MAX_LATE or self._partial_total > LATE_BYTES):
            self._let_go(min(self._partial))

    def _let_go(self, it: int) -> None:
        if self._partial.pop(it, None) is not None:
            self._partial_total -= self._partial_bytes.pop(it, 0)

    def _reanalyse(self, it: int) -> None:
        events = self._partial[it]
        complete = not missing(self._admission, it, events)
        analyses = self.analyses
        if self.window is not None and len(analyses) >= self.window and analyses and it < analyses[0].iteration:
            # Out of the window already: nothing to show again, only the count to mend.
            if complete:
                self.incomplete -= 1
                self._let_go(it)
            return
        analysis = self._analyse(it, events, complete)
        if analysis is None:
            return
        i = bisect.bisect_left(analyses, it, key=_iteration)
        if i < len(analyses) and analyses[i].iteration == it:
            self._tasks_kept -= len(analyses[i].tasks)
            del analyses[i]
            if i < self._bare:
                self._bare -= 1
        if complete:
            self.incomplete -= 1
            self._let_go(it)
        self._insert(analysis)

    def _analyse(self, it: int, events: dict[int, Sequence[wire.Event]], complete: bool) -> IterationAnalysis | None:
        ranks = [r for r in events if events[r]]
        if not ranks:
            return None
        self._clocks.observe(events)
        offsets = self._clocks.offsets(ranks)
        run = self._admission.run_of(it)
        states = run.ranks if run is not None else {}
        warm_up = it - (run.base if run is not None else 0) < WARM_UP
        previous = {r: end + offsets[r] for r in ranks
                    if (s := states.get(r)) is not None and (end := s.update_end.get(it - 1)) is not None}
        suspect = self._suspect(it)
        shared = self._cohosts(states)
        try:
            analysis = analyse(it, events, offsets, previous, complete, self._comm.model(),
                               interference=self._interference, learn=not warm_up,
                               bandwidth_gbps=self.bandwidth_gbps, suspect=suspect, cohosts=shared)
        except Exception as exc:  # noqa: BLE001 - a model bug must not take the monitor down
            self._admission.reject(f"iteration {it} could not be analysed: {type(exc).__name__}: {exc}")
            return None
        analysis = dataclasses.replace(analysis, warm_up=warm_up)
        if complete and self._stalled is not None and self._stalled(it, analysis.measured_ms):
            return dataclasses.replace(analysis, stalled=True)  # its collectives waited for the stall: not the fit's
        if not warm_up:  # warm-up buckets are not the job's: keep them out of the fit
            for count, nbytes, seconds in transfers(analysis.collectives):
                self._comm.add(len(analysis.ranks), nbytes, seconds, count)
        return analysis

    def _cohosts(self, states: Mapping[int, RankState]) -> dict[int, CoHost]:
        """The CPU ranks sharing a host with other ranks, as the hellos say; worked out again only when a rank's
        hello is another than last time (a new process, a new run), not every iteration."""
        hellos = tuple(s.hello for s in states.values())
        if hellos != self._hellos:
            self._hellos = hellos
            self._shared = cohosts({r: (s.hello.host, s.hello.device) for r, s in states.items() if s.hello is not None})
        return self._shared

    def _suspect(self, it: int) -> tuple[int, str] | None:
        """(rank, category) of the straggler the steady verdict named as of the iteration before ``it``."""
        analyses = self.analyses
        if analyses and analyses[-1].iteration < it:  # the usual case: the newest iteration
            at = len(analyses)
        else:
            at = bisect.bisect_left(analyses, it, key=_iteration)
        steady = analyses[at - 1].steady if at > 0 else None
        if steady is None or steady.straggler is None:
            return None
        return steady.straggler.rank, steady.straggler.category

    def _remember(self, it: int) -> None:
        self._analysed[it] = True
        while len(self._analysed) > _REMEMBERED:
            old, _ = self._analysed.popitem(last=False)
            self._let_go(old)

    def _insert(self, analysis: IterationAnalysis) -> None:
        analyses = self.analyses
        at = bisect.bisect(analyses, analysis.iteration, key=_iteration)
        if at < self._bare and analysis.tasks:
            analysis = dataclasses.replace(analysis, tasks=NO_TASKS)  # among those that gave theirs up: older go first
        analyses.insert(at, analysis)
        self._tasks_kept += len(analysis.tasks)
        if at < self._bare:
            self._bare += 1
        # Its steady verdict follows from the one before it, and the newest's again where it came before the newest
        # (a late re-analysis): the newest now counts it. Those in between keep theirs (:mod:`dagtop.model.verdict`).
        analyses[at:at + 1] = verdict.fold(analyses, at, at + 1)
        if at < len(analyses) - 1:
            analyses[-1:] = verdict.fold(analyses, len(analyses) - 1)
        if self.window is not None:
            while len(analyses) > self.window:
                old = analyses.pop(0)
                self._tasks_kept -= len(old.tasks)
                self._bare = max(0, self._bare - 1)
        i = self._bare
        while self._tasks_kept > self.task_budget and i < len(analyses) - 1:
            a = analyses[i]
            if a.tasks:
                self._tasks_kept -= len(a.tasks)
                analyses[i] = dataclasses.replace(a, tasks=NO_TASKS)
            i += 1
        self._bare = max(self._bare, i)
