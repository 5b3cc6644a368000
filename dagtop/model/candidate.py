"""One change a user can make and what the model predicts for it, and the window of iterations candidates are made
from (how far a prediction can be trusted: :mod:`dagtop.model.trust`)."""

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
    """Every re-run of its kind of change under like conditions met the target (:mod:`dagtop.model.trust`)."""
    LOWER = "lower"
    """Predicted, outside what the re-runs validated (the reason is given)."""
    WITHHELD = "withheld"
    """Not predicted: the model lacks what it needs (the reason is given)."""


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

    def compute_over_fastest(self) -> dict[int, float]:
        """Each rank's median compute over the window less the fastest rank's, ms."""
        compute: dict[int, list[float]] = {}
        for a in self.analyses:
            for row in a.per_rank:
                compute.setdefault(row.rank, []).append(row.compute_ms)
        typical = {r: statistics.median(xs) for r, xs in compute.items()}
        fastest = min(typical.values(), default=0.0)
        return {r: ms - fastest for r, ms in typical.items()}

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
