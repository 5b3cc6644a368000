"""What to do next: the changes a user can make, each with the step time and throughput the model predicts for it,
its evidence and a confidence, ranked; and the gate that holds advice back until the model can be trusted.

Fixes (the same workers, a change to the job) come first, best throughput first; then buying (more workers, a
faster network), each with its scaling efficiency; then what the model was asked and could not predict, each with
why. Every prediction is the iteration as the DAG replays it with the change, over the steady verdict's window:
``speedup`` is the replayed iteration now over the replayed iteration changed (medians), the step time shown is the
measured one over that speedup.

Nothing is advised from fewer iterations than the steady verdict's window (:data:`dagtop.model.verdict.WINDOW`), nor
when the replay misses the measured iterations by more than :data:`MAX_REPLAY_ERROR` (ByteDance's straggler
what-if discards such traces too, OSDI'25), nor when the step drifted within the window by more than
:data:`MAX_DRIFT`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dagtop.model import verdict
from dagtop.model.allreduce import fit
from dagtop.model.analysis import model_error
from dagtop.model.bucket_map import Layout, backward_of, together_on
from dagtop.model.buckets import BucketModel, model_buckets, steal_of, stretched
from dagtop.model.candidate import (
    MAX_REPLAY_ERROR,
    MIN_GAIN,
    Candidate,
    Confidence,
    Kind,
    Window,
    cores_per_rank,
    launch_ms,
    others_ms,
    shim_ms,
)
from dagtop.model.candidates import MAKERS
from dagtop.model.snapshot import IterationAnalysis, RankInfo, Snapshot
from instrument.wire import Buckets, Telemetry, ThreadCpu

__all__ = ["MAX_DRIFT", "MAX_REPLAY_ERROR", "MIN_GAIN", "WINDOW", "Advice", "Candidate", "Confidence", "Kind", "advise",
           "advise_snapshot", "window_of"]

WINDOW = 50
"""Steady iterations the advice reads at most: its medians steady over more of them than the verdict's window (which
is the least it needs)."""
MAX_DRIFT = 0.33
"""The most the median step of the window's two halves may differ (the larger over the smaller, less one). Past it
the job changed speed within the window (another job took its cores, a new phase of training), and the advice
waits: on a 2-core machine whose load rose from about 7 to 14 mid-recording (halves 73.5 and 123.3 ms, +68 %,
2026-11-27), the bucket change predicted from the mixture gained ×2.42 where ×1.57 was predicted
(benchmarks/validate_advice.py); the other recordings of that run drifted 1-13 %, the demo's fixtures up to 25 %.
A third lies between."""


@dataclass(frozen=True, slots=True)
class Advice:
    """The ranked candidates over a window of steady iterations, or why there are none yet."""

    iterations: int
    needed: int
    step_ms: float
    """The measured step, median over the window."""
    replay_error: float
    held: str
    """Why nothing is advised ("" when advising)."""
    fixes: tuple[Candidate, ...] = ()
    """Changes to the job on the same workers, best throughput first."""
    buys: tuple[Candidate, ...] = ()
    """More workers, a faster network."""
    withheld: tuple[Candidate, ...] = ()
    buckets: BucketModel | None = None
    last_iteration: int = -1
    little: tuple[Candidate, ...] = ()
    """Fixes predicted to gain under :data:`MIN_GAIN`: considered, not advised."""
    shim_ms: float = 0.0
    """dagtop's own time in a step, which the predictions take out (:attr:`Window.shim_ms`)."""

    @property
    def without_dagtop(self) -> str:
        """What the predictions took out for dagtop, in words; empty where nothing was."""
        return (f"predicted without dagtop's own {self.shim_ms:.1f} ms a step in its hooks" if self.shim_ms >= 0.05
                else "")

    @property
    def best(self) -> Candidate | None:
        """The change the advice leads with, among the fixes that gain at least :data:`MIN_GAIN` (a 'keep the
        buckets' gains nothing): the one predicted to gain most among those that leave what the job computes alone,
        else the best of those with a caveat."""
        gaining = [c for c in self.fixes if (c.throughput or 0) >= 1 + MIN_GAIN]  # not a 'keep it as it is'
        return next((c for c in gaining if not c.caveat), gaining[0] if gaining else None)

    def headline(self) -> str:
        """The first line a person reads: the best change and its gain, or why there is none."""
        if self.held:
            return f"no advice yet: {self.held}"
        best = self.best
        if best is None:
            return (f"nothing to fix: no change to the job is predicted to gain {MIN_GAIN * 100:.0f} % or more "
                    f"(step {self.step_ms:.1f} ms)")
        assert best.step_ms is not None
        weigh = f" (with a caveat: nothing without one gains {MIN_GAIN * 100:.0f} %)" if best.caveat else ""
        if best.lower_bound:
            gain = f"throughput at least {best.gain.lstrip('≥')}, step {self.step_ms:.1f} → {best.step_ms:.1f} ms or less"
        else:
            gain = f"throughput {best.gain}, step {self.step_ms:.1f} → {best.step_ms:.1f} ms"
        more = self.may_gain_more()
        beside = f"; {more[0].title} may gain more (at least {more[0].gain.lstrip('≥')})" if more else ""
        return f"best change: {best.title} ({best.kind}): {gain}{weigh}{beside}"

    def may_gain_more(self) -> list[Candidate]:
        """The fixes ranked after the best by a gain that is only their lower bound: they may truly gain more than
        it (the ranking puts a lower bound where its least would be, never as a point)."""
        best = self.best
        if best is None:
            return []
        after = self.fixes[self.fixes.index(best) + 1:]
        return [c for c in after if c.lower_bound and not c.caveat and (c.throughput or 0) >= 1 + MIN_GAIN]


def window_of(analyses: Sequence[IterationAnalysis]) -> list[IterationAnalysis]:
    """The iterations advised on: the last :data:`WINDOW` that count towards the verdict."""
    return _counted(analyses)[-WINDOW:]


def _counted(analyses: Sequence[IterationAnalysis]) -> list[IterationAnalysis]:
    return [a for a in analyses if verdict.counts(a)]


def advise(analyses: Sequence[IterationAnalysis], ranks: Sequence[RankInfo] = (), buckets: Buckets | None = None,
           telemetry: Sequence[Telemetry] = (), thread_cpu: Mapping[int, Mapping[int, ThreadCpu]] | None = None
           ) -> Advice:
    """Every candidate over the steady window of ``analyses`` (oldest first); ``thread_cpu``: iteration → rank →
    the training thread's CPU times (:attr:`~dagtop.model.snapshot.Snapshot.thread_cpu`), where the ranks sent them."""
    counted = _counted(analyses)
    chosen = counted[-WINDOW:]
    needed = verdict.WINDOW
    if not chosen:
        return Advice(0, needed, 0.0, 0.0, f"no steady iteration analysed yet (the advice needs {needed})")
    step = statistics.median(a.measured_ms for a in chosen)
    error = statistics.median(model_error(a) for a in chosen)
    last = chosen[-1].iteration
    if len(chosen) < needed:
        return Advice(len(chosen), needed, step, error, f"{len(chosen)} of the {needed} steady iterations the "
                      "verdict needs", last_iteration=last)
    if error > MAX_REPLAY_ERROR:
        return Advice(len(chosen), needed, step, error, f"the model replays these iterations {error * 100:.1f} % off "
                      f"what was measured (over {MAX_REPLAY_ERROR * 100:.0f} %): its predictions would not hold",
                      last_iteration=last)
    half = len(chosen) // 2
    early, late = (statistics.median(a.measured_ms for a in part) for part in (chosen[:half], chosen[half:]))
    if max(early, late) > (1 + MAX_DRIFT) * min(early, late):
        return Advice(len(chosen), needed, step, error, f"the step changed within these iterations (median "
                      f"{early:.1f} ms in the first half, {late:.1f} ms in the second): a prediction from both would "
                      "hold for neither", last_iteration=last)
    ranks_now = len(chosen[-1].ranks)
    backwards = [b for b in map(backward_of, chosen) if b is not None]
    comm = fit([o for b in backwards for o in b.observed()], ranks_now)
    units = {k for b in backwards for k in b.ready}
    layout = Layout.of(buckets, sorted(units)) if buckets is not None else None
    cpus = thread_cpu or {}
    launches = launch_ms(chosen, cpus)
    model = None
    if layout is not None and backwards and comm is not None and layout.mapped >= 0.5:
        together = together_on([r.device for r in ranks])
        launch = launches * 1e6 / len(layout.now) if layout.now else 0.0
        beside, cores = others_ms(chosen, cpus), cores_per_rank(ranks, telemetry)
        if together == 1:
            model = model_buckets(layout, backwards, comm, launch, steal_of(layout, comm, beside, cores))
            comm = model.comm
        else:
            # Regrouping is weighed on each all-reduce's share of the channel (bucket_map.shares): over a 1 Gbit/s
            # link the cut one after the other predicted ×1.00 for what gained ×1.13. The other changes keep the
            # all-reduces cut one after the other: re-judged on 19 re-runs of accumulation, the shares' fit made
            # its CPU taken from the backward twice as large and met the target in 8 where the cut met it in 16.
            comm = stretched(layout, backwards, comm)
            shared = [b for b in (backward_of(a, together) for a in chosen) if b is not None]
            fitted = fit([o for b in shared for o in b.observed()], ranks_now)
            model = (model_buckets(layout, shared, fitted, launch, steal_of(layout, fitted, beside, cores))
                     if fitted is not None else None)
    copies, adds = (buckets.copy_ns / 1e6, buckets.add_ns / 1e6) if buckets is not None else (0.0, 0.0)
    w = Window(tuple(chosen), step, statistics.median(a.predicted_ms for a in chosen), ranks_now, comm,
               tuple(backwards), layout, model, tuple(ranks), tuple(telemetry), copies_ms=copies, adds_ms=adds,
               history=tuple(counted[-verdict.HISTORY:]),
               thread_cpu={a.iteration: cpus[a.iteration] for a in chosen if a.iteration in cpus},
               shim_ms=shim_ms(chosen, cpus), launch_ms=launches)
    found = [c for make in MAKERS for c in make(w)]
    predicted = [c for c in found if c.confidence is not Confidence.WITHHELD]
    buying = {Kind.SCALE_OUT, Kind.NETWORK}
    # A fix predicted to gain under MIN_GAIN is not worth the change (nor within what the model can tell), except
    # a "keep it as it is", which is advice too. Those that change what the job computes (numerics, the
    # optimisation) come after those that do not, whatever they gain: the user decides on them.
    # A lower bound ranks by its least gain: it is at least as good as where it stands (the headline says when it
    # stands after the best: it may gain more).
    gaining = sorted((c for c in predicted if c.kind not in buying), key=lambda c: -(c.throughput or 0))
    little = tuple(c for c in gaining if c.setting and (c.throughput or 0) < 1 + MIN_GAIN)
    fixes = [c for c in gaining if c not in little and not c.caveat] + [c for c in gaining
                                                                         if c not in little and c.caveat]
    buys = [c for c in predicted if c.kind in buying]
    withheld = [c for c in found if c.confidence is Confidence.WITHHELD]
    return Advice(len(chosen), needed, step, error, "", tuple(fixes), tuple(buys), tuple(withheld), model, last,
                  little, w.shim_ms)


def advise_snapshot(snap: Snapshot) -> Advice:
    """:func:`advise` on everything a snapshot holds."""
    return advise(snap.iterations, snap.ranks, snap.buckets, snap.telemetry, snap.thread_cpu)
