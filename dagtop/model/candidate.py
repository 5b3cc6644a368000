"""One change a user can make and what the model predicts for it; the window of iterations candidates are made
from; how far each kind of prediction can be trusted."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagtop.model.allreduce import AllReduce
from dagtop.model.bucket_map import Backward, Layout
from dagtop.model.buckets import BucketModel
from dagtop.model.change import Change
from dagtop.model.label import Label
from dagtop.model.snapshot import IterationAnalysis, RankInfo
from instrument.wire import Telemetry, ThreadCpu

MIN_GAIN = 0.02
"""A change is worth naming when it predicts at least this much more throughput."""
MAX_REPLAY_ERROR = 0.05
"""A replay further off what was measured than this (|replayed − measured| / measured) predicts nothing."""


class Kind(Label):
    """What a candidate changes. The value is its name on screen and in the JSON."""

    BUCKETS = "gradient buckets"
    LOADER = "input pipeline"
    PINNED = "host-to-device copies"
    COMPRESSION = "gradient compression"
    ACCUMULATION = "gradient accumulation"
    STRAGGLER = "straggler"
    SCALE_OUT = "more workers"
    NETWORK = "faster network"


class Confidence(Label):
    """How far a candidate's prediction can be trusted."""

    VALIDATED = "validated"
    """Its kind of change met ±10 % of a real re-run in benchmarks/validate_advice.py."""
    LOWER = "lower"
    """Predicted, but not validated that well (the reason is given)."""
    WITHHELD = "withheld"
    """Not predicted: the model lacks what it needs (the reason is given)."""


DOUBT: Mapping[Kind, str] = {
    Kind.PINNED: "not validated: the test machine has no GPU",
    Kind.SCALE_OUT: "not validated: the α-β fit is extrapolated to more ranks than ran, and the test machine's 2 "
                    "cores cannot run more ranks without measuring core sharing instead",
    Kind.NETWORK: "not validated: the test machine has one network (its loopback)",
    Kind.ACCUMULATION: ("priced from the training thread's CPU time and re-run on a 2-core CPU machine "
                        "(2026-11-27/29, ten runs; from the fourth with dagtop's own time in its hooks taken out, "
                        "from the eighth DDP's launches too): within the target in 37 of 59 predictions. On MLPs of "
                        "14 layers 8 of 9 (-0.9 to -8.8 %, then -17.6 %), a pyramid 7 of 9, a loader-bound job 8 of "
                        "9, a CPU-hogged one 5 of 8 (over by 11.4, 16.5 and 27.1 % in three), a transformer 4 of 9 "
                        "(1.1-1.6 points under, at a gain of 8-10 %), a Lightning Trainer job not written for it 3 "
                        "of 3 (+2.3 to +4.7 %, benchmarks/lightning_accumulation.py); under-predicted on MLPs of 41 "
                        "small layers (-6.2 to -18.5 %, 2 of 8 within) and of tiny buckets (-10.8 to -21.7 %, 0 of "
                        "4). There a micro-batch is priced from a synced step's CPU work, which runs slower than "
                        "under no_sync (its forward's CPU time by 21-24 %, its update's by 33-38 %: "
                        "benchmarks/synced_cpu.py): on that machine a step's CPU work after a pause runs slower (by "
                        "10-17 % after 10 ms, spun or slept: benchmarks/pause_cpu.py), and a synced step follows its "
                        "wait for the all-reduces where a micro-batch goes straight on, which no synced step shows. "
                        "On the hogged rank a synced step's forward, just after that wait, ran as fast as on the "
                        "other rank and its backward twice as slow: a micro-batch, with no wait, likely shares the "
                        "core with the hog throughout. The same job recorded twice was predicted up to 20 % apart "
                        "(in one recording one rank of a balanced job computed 15-18 % slower in every phase, which "
                        "its re-run did not). Replayed from the wall clock instead (older shims), the MLPs were "
                        "under by 13-20 % and the loader-bound and hogged jobs over by up to 22 %. On a faster host "
                        "(2026-11-29, five runs): 25 of 33 within; the MLPs of 41 small layers 6 of 11 (-24.1 to "
                        "+1.0 %), the hogged job 2 of 3 (+15.8 % once), the transformers 3 of 5 (1.2 and 1.5 points "
                        "off at gains under 8 %), every other job 14 of 14. With a rank's slower compute kept only "
                        "as far as its host gave other processes CPU (the next five runs): the MLPs of 41 "
                        "small layers 3 of 6 (-14.5 to -5.1 %), of 18 layers of tiny buckets 2 of 3 (-11.8 % once), "
                        "the hogged job 1 of 3 (+3.5, +11.5 and +18.5 %: its recordings' steps ran 7-27 % slower "
                        "than its re-runs' with dagtop on), a transformer 3.5 points under at a gain of 6 %, the "
                        "other jobs 11 of 11"),
    Kind.BUCKETS: ("re-run on a 2-core CPU machine (2026-11-27/29). Before gloo's work beside the backward was "
                   "priced: within 10 % in 14 of 17 changes on the first day (median error 4.3 %); DDP's default "
                   "over one bucket per layer under in most runs (×1.12-1.50 predicted, ×1.28-1.59 re-run, 8 of 19 "
                   "within 10 %); over an MLP's tiny buckets the re-runs spread ±10 % and more, and DDP's default "
                   "re-ran as fast as or faster than a grouping advised over it (bucket_cap_mb=2, MG-WFBP's) in "
                   "five runs. With it priced (2026-11-29, four runs: gloo's threads' CPU a step over the α-β "
                   "work of the buckets now, 0.68-0.85 on these jobs), DDP's default was advised over both and truly "
                   "best in all four: over the tiny buckets ×1.33, ×1.25, ×1.34, ×1.22 predicted, ×1.17, ×1.18, "
                   "×1.15, ×1.14 re-run (+14.2, +6.0, +16.3, +7.6 %), over one bucket per layer ×1.45, ×1.51, "
                   "×1.37, ×1.58 predicted, ×1.45, ×1.42, ×1.43, ×1.44 re-run (-0.3, +6.2, -3.8, +9.9 %); the same "
                   "recordings without it: ×1.22, ×1.16 (a cap of 1 MB advised), ×1.16, ×1.17 (MG-WFBP's grouping "
                   "advised) and ×1.34, ×1.30, ×1.27, ×1.40. Measured without dagtop "
                   "(benchmarks/gloo_cpu.py), that share over-states what regrouping changes on the first MLP: "
                   "DDP's default took 3.2 ms less CPU a step than its tiny buckets, twice, for 6.8 ms less α-β "
                   "work (0.47); 6.6 and 5.3 ms less for 8.4 on the 41 layers (0.79, 0.63). Over a "
                   "1 Gbit/s link, MG-WFBP's grouping ×1.12, ×1.12, ×1.08, ×1.05 predicted, ×1.13, ×1.10, ×1.08, "
                   "×1.05 re-run. On a faster host (2026-11-29, five runs), DDP's default over one bucket per layer "
                   "of 41 small layers, its buckets over ten times the largest timed, over-shot in 4 of 4 (by 7.8, "
                   "15.3, 29.4 and 30.5 %: ×1.53-1.78 predicted, ×1.34-1.44 re-run): such groupings are no longer advised, and "
                   "bucket_cap_mb=0.25 was (×1.247, ×1.239 predicted, ×1.247, ×1.219 re-run); over the 18-layer "
                   "MLP's tiny buckets a 1 MB cap over-shot in 4 of 4 (×1.45, ×1.26, ×1.47, ×1.15 predicted, "
                   "×1.03, ×1.06, ×1.14, ×0.98 re-run; DDP's default ×1.00-1.16): three of those fits read a "
                   "per-byte time within its noise, which now withholds the advice, the fourth 0.36 ± 0.10 ns a "
                   "byte. Over a 1 Gbit/s link, with the buckets in flight at the backward's end each timed to "
                   "its own end (gloo runs two at once), a deep, narrow MLP: bucket_cap_mb=8 over DDP's default "
                   "×1.149, ×1.153, ×1.147, ×1.150 predicted, ×1.223, ×1.230, ×1.225, ×1.226 re-run; on the "
                   "wider MLP three keeps where another grouping re-ran ×1.087, ×1.041, ×1.030 (×1.036, ×1.045, "
                   "×1.039 predicted, under the 10 % it takes to advise one). Over the 41 "
                   "small layers' tiny buckets bucket_cap_mb=0.25 within 5 % in 3 of 3; over the 18 layers' a "
                   "1 MB cap ×1.176 predicted, ×1.086 re-run"),
    Kind.STRAGGLER: "on CPU cores the job shares, said as a lower bound: at least ×1.12 and ×1.05 predicted, ×1.61 and "
                    "×1.65 re-run with the CPU hog stopped (2-core CPU machine at load 1-3, 2026-11-27; at least ×1.11 and "
                    "×1.20 predicted, ×1.68 and ×1.66 re-run on 2026-11-28); as a point it "
                    "missed both ways (×1.51 predicted, ×1.29 re-run at load 13; ×1.26-×1.32, ×1.37-×1.40 before)",
    Kind.COMPRESSION: "not validated: the test machine has no GPU (on CPU ranks it is not advised: measured slower)",
}
"""Why a kind's predictions are of lower confidence (from benchmarks/validate_advice.py; the figures are throughput
ratios, predicted and re-run)."""
VALIDATED: frozenset[Kind] = frozenset({Kind.LOADER})
"""The kinds whose predictions met the target in every round of benchmarks/validate_advice.py (DataLoader workers:
×1.32, ×1.37, ×1.37, ×1.38 predicted, ×1.38, ×1.37, ×1.28, ×1.46 re-run, the last at load 12, 2026-11-27; ×1.43,
×1.48, ×1.49 predicted, ×1.45, ×1.46, ×1.49 re-run on 2026-11-28, with dagtop's time taken out)."""


def confidence_of(kind: Kind) -> tuple[Confidence, str]:
    """A kind's confidence, and why it is lower where it is."""
    if kind in VALIDATED:
        return Confidence.VALIDATED, ""
    return Confidence.LOWER, DOUBT.get(kind, "not validated yet against a re-run")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One change a user can make, and what the model predicts for it."""

    kind: Kind
    title: str
    """The change in a few words: ``bucket_cap_mb=16``, ``num_workers=1``."""
    change: str
    """Exactly what to write (code or configuration), or what to do."""
    setting: Mapping[str, Any] = field(default_factory=dict)
    """The change as keyword arguments, for tools: ``{"bucket_cap_mb": 16}``; {} where it is not a setting."""
    step_ms: float | None = None
    """Predicted time per step (a step of ``samples`` times the batch)."""
    range_ms: tuple[float, float] | None = None
    speedup: float | None = None
    """Replayed step now / replayed step with the change."""
    workers: int = 1
    """Times the job's ranks it runs on."""
    samples: int = 1
    """Times the samples per step (gradient accumulation's micro-batches)."""
    evidence: str = ""
    confidence: Confidence = Confidence.VALIDATED
    doubt: str = ""
    """Why the confidence is lower, or why nothing was predicted."""
    caveat: str = ""
    """What else the change changes, for the user to weigh (numerics, the optimisation)."""
    lower_bound: str = ""
    """Why the prediction is a lower bound on the gain (so the step and an epoch's time and cost are at most what
    is shown), from the what-if it rests on (:attr:`dagtop.model.snapshot.WhatIf.lower_bound`); empty for a point."""

    @property
    def throughput(self) -> float | None:
        """Samples per second with the change over now."""
        return None if self.speedup is None else self.speedup * self.workers * self.samples

    @property
    def efficiency(self) -> float | None:
        """Throughput per worker: 1 for a perfect scale-out; the throughput itself for a fix."""
        return None if self.throughput is None else self.throughput / self.workers

    @property
    def gain(self) -> str:
        """``+23 %`` samples/s (``≥+23 %`` for a lower bound), or ``—`` when not predicted."""
        if self.throughput is None:
            return "—"
        return f"{'≥' if self.lower_bound else ''}{(self.throughput - 1) * 100:+.0f} %"


@dataclass(frozen=True, slots=True)
class Window:
    """The steady iterations advised on, with everything a candidate reads from them."""

    analyses: tuple[IterationAnalysis, ...]
    step_ms: float
    identity_ms: float
    ranks: int
    comm: AllReduce | None
    """The bucket all-reduces' α-β-κ fit over the window (:mod:`dagtop.model.allreduce`)."""
    backwards: tuple[Backward, ...] = ()
    """The window's backwards as the buckets see them."""
    layout: Layout | None = None
    """The gradients and their buckets now, where the ranks sent their sizes."""
    buckets: BucketModel | None = None
    """Every grouping of them replayed (:func:`dagtop.model.buckets.model_buckets`)."""
    infos: tuple[RankInfo, ...] = ()
    """The ranks as their hellos describe them (device, host, DataLoader)."""
    telemetry: tuple[Telemetry, ...] = ()
    copies_ms: float = 0.0
    """What a synced step spends in DDP's copies of the gradients into its buckets and back, which ``no_sync``
    skips (measured by the shim on CPU ranks, 0 elsewhere; dagtop times them only as part of the backward)..."""
    adds_ms: float = 0.0
    """...and what adding a micro-batch's gradients to those accumulated takes, which accumulation adds."""
    history: tuple[IterationAnalysis, ...] = ()
    """The counted iterations up to the window's last (as many as the verdict reads), which the straggler test takes
    a window that lasts long enough from (:func:`dagtop.model.straggler.span`), as the live verdict does."""
    thread_cpu: Mapping[int, Mapping[int, ThreadCpu]] = field(default_factory=dict)
    """Iteration → rank → the training thread's CPU times in it, for the window's iterations the ranks measured
    them in (CPU ranks)."""
    shim_ms: float = 0.0
    """dagtop's own time in a step: its hooks' on the training threads, where every rank measured it in every
    iteration of the window (CPU ranks; :func:`shim_ms`), else 0."""
    launch_ms: float = 0.0
    """DDP's launches of its buckets' all-reduces in a step, on the training threads, where every rank measured them
    in every iteration of the window (CPU ranks; :func:`launch_ms`), else 0: ``no_sync`` makes none."""

    def predicted(self, per_iteration: Sequence[float], fit: tuple[float, float] | None = None,
                  base: Sequence[float] | None = None, samples: int = 1) -> tuple[float, float, tuple[float, float]]:
        """(speedup, step ms, range ms) from per-iteration replays with a change. The range is the 95 % interval of
        the median over the window (:func:`median_interval`), widened to ``fit``: the median replay with the α-β
        fit's β one standard error down and up, where the change rests on it. ``base``: the replays without the
        change of the same iterations, where ``per_iteration`` covers only some of the window.

        The speedup is the job's without dagtop: its hooks' time (:attr:`shim_ms`) comes out of the step now and
        out of each of the ``samples`` passes a changed step makes (gradient accumulation's micro-batches), where
        the hooks ran on the training thread, inside the steps (CPU ranks). The step and its range stay the
        measured step's (with dagtop) over that speedup."""
        median = statistics.median(per_iteration)
        identity = statistics.median(base) if base else self.identity_ms
        own = self.shim_ms if identity > self.shim_ms and median > samples * self.shim_ms else 0.0

        def step(replayed: float) -> float:  # the measured step, changed as the replay is, less dagtop's own time
            return self.step_ms * (replayed - samples * own) / (identity - own) if identity > own else self.step_ms

        lo, hi = median_interval(per_iteration)
        if fit is not None:
            lo, hi = min(lo, *fit), max(hi, *fit)
        speedup = (identity - own) / (median - samples * own) if median > samples * own else math.inf
        return speedup, self.step_ms / speedup, (step(lo), step(hi))

    def foreign_ms(self, host: str) -> float | None:
        """CPU time a step on ``host`` that its ranks' processes did not take: the host's busy share in its latest
        sample over all its CPUs, for the window's median step, less each of its ranks' training thread and the
        process's other threads (the window's medians of ``ThreadCpu.total_ns`` and ``others_ns``). What another
        process there takes (a CPU hog, a second job; also dagtop's monitor and the shim's threads, a few % of a
        core), not the job's own gloo threads. Not below 0 (the host's sample spans its last 2 s, not the window);
        None where the host sent no CPU figure or one of its ranks no thread CPU in an iteration of the window."""
        stats = next((t.host_stats for t in self.telemetry if t.host == host and t.host_stats is not None
                      and t.host_stats.cpu_percent is not None and t.host_stats.cpus), None)
        ranks = [r.rank for r in self.infos if r.host == host]
        if stats is None or not ranks or not self.analyses:
            return None
        spent = 0.0
        for r in ranks:
            per = [self.thread_cpu.get(a.iteration, {}).get(r) for a in self.analyses]
            if any(c is None or not c.total_ns for c in per):
                return None
            spent += statistics.median(c.total_ns + c.others_ns for c in per if c is not None) / 1e6
        busy = (stats.cpu_percent or 0.0) / 100 * (stats.cpus or 0) * statistics.median(
            a.measured_ms for a in self.analyses)
        return max(busy - spent, 0.0)

    def unpredictable(self, change: Change) -> str:
        """Why the newest iteration's ``change`` could not be predicted (the what-if's reason), empty if it could."""
        for a in reversed(self.analyses):
            x = next((x for x in a.what_if if x.change is change), None)
            if x is not None:
                return x.unpredictable
        return ""


def shim_ms(analyses: Sequence[IterationAnalysis], thread_cpu: Mapping[int, Mapping[int, ThreadCpu]]) -> float:
    """dagtop's own time in a step of ``analyses``: the median over them of the ranks' median time in the shim's
    hooks (``ThreadCpu.shim_ns``); 0 unless every rank measured it in every one (CPU ranks of a shim that sends it).

    It is what its hooks spend inside them (and the tap around each bucket's all-reduce): torch's calls into them
    and the shim's thread that sends the frames cost the step more (on the 41-layer MLP of
    benchmarks/advice_jobs.py, two CPU ranks, 2026-11-28: 1.2 of the 2.3 ms a step dagtop cost with DDP's default
    buckets, 2.4 of 4.1 ms with a bucket per layer), so what the predictions take out is the least of its cost."""
    return _every_rank(analyses, thread_cpu, "shim_ns")


def launch_ms(analyses: Sequence[IterationAnalysis], thread_cpu: Mapping[int, Mapping[int, ThreadCpu]]) -> float:
    """What DDP's launches of its buckets' all-reduces (its calls into the process group) take the training thread in
    a step of ``analyses``: the median over them of the ranks' median (``ThreadCpu.launch_ns``); 0 unless every rank
    measured it in every one (CPU ranks of a shim that sends it). The least of what a bucket costs the thread:
    the reducer's own bookkeeping around each is outside the call."""
    return _every_rank(analyses, thread_cpu, "launch_ns")


def others_ms(analyses: Sequence[IterationAnalysis], thread_cpu: Mapping[int, Mapping[int, ThreadCpu]]) -> float:
    """The process's CPU time beside the training thread in a step of ``analyses`` (gloo's threads; less the
    shim's): the median over them of the ranks' median (``ThreadCpu.others_ns``); 0 unless every rank measured it
    in every one (CPU ranks of a shim that sends it)."""
    return _every_rank(analyses, thread_cpu, "others_ns")


def cores_per_rank(ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> int | None:
    """The fewest CPUs per rank over the hosts (from the telemetry), None where no host says."""
    per_host: dict[str, int] = {}
    for r in ranks:
        per_host[r.host] = per_host.get(r.host, 0) + 1
    cpus = {t.host: t.host_stats.cpus for t in telemetry if t.host_stats is not None and t.host_stats.cpus}
    known = [cpus[h] // n for h, n in per_host.items() if h in cpus]
    return max(min(known), 1) if known else None


def _every_rank(analyses: Sequence[IterationAnalysis], thread_cpu: Mapping[int, Mapping[int, ThreadCpu]],
                part: str) -> float:
    """The median over ``analyses`` of the ranks' median ``part`` of their ``ThreadCpu``, in ms; 0 unless every
    rank sent it, nonzero, in every one."""
    per = []
    for a in analyses:
        ranks = thread_cpu.get(a.iteration, {})
        ns = [getattr(ranks[r], part) for r in a.ranks if r in ranks]
        if len(ns) < len(a.ranks) or not all(ns):
            return 0.0
        per.append(statistics.median(ns) / 1e6)
    return statistics.median(per) if per else 0.0


def median_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """The distribution-free interval of a median: the order statistics ``n/2 ∓ z·√n/2`` (95 % with z = 1.96).

    >>> median_interval(list(range(1, 21)))  # the 6th and the 16th of 20
    (6, 16)
    """
    xs = sorted(values)
    n = len(xs)
    half = z * math.sqrt(n) / 2
    lo, hi = max(math.floor(n / 2 - half), 0), min(math.ceil(n / 2 + half), n - 1)
    return xs[lo], xs[hi]


def withheld(kind: Kind, title: str, why: str) -> Candidate:
    """A candidate the model cannot predict, and why."""
    return Candidate(kind, title, "", confidence=Confidence.WITHHELD, doubt=why)
