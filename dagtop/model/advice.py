"""What to do next: the changes a user can make, each with the step time and throughput the model predicts for it,
its evidence and a confidence, ranked; and the gate that holds advice back until the model can be trusted.

Fixes (the same workers, a change to the job) come first, best throughput first; then buying (more workers, a
faster network), each with its scaling efficiency; then what the model was asked and could not predict, each with
why. Every prediction is the iteration as the DAG replays it with the change, over the steady verdict's window:
``speedup`` is the replayed iteration now over the replayed iteration changed (medians), the step time shown is the
measured one over that speedup.

Nothing is advised from fewer iterations than the steady verdict's window (:data:`dagtop.model.verdict.WINDOW`) nor
when the replay misses the measured iterations by more than :data:`MAX_REPLAY_ERROR` (ByteDance's straggler
what-if discards such traces too, OSDI'25).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dagtop.model import verdict
from dagtop.model.analysis import model_error, segments_ms
from dagtop.model.allreduce import AllReduce, fit
from dagtop.model.buckets import Backward, BucketModel, Layout, backward_of, finish_ns, model_buckets
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis, RankInfo, Snapshot
from instrument.wire import Buckets, Telemetry

MAX_REPLAY_ERROR = 0.05
"""Median |replayed − measured| / measured over the window above which nothing is advised."""
MIN_GAIN = 0.02
"""A change is worth naming when it predicts at least this much more throughput."""
NEAR = 0.01
"""Two bucket groupings within this share of the step are as good as each other: the simpler one is named."""
WORKER_TRANSFER_MS = 1.7
"""What ``next()`` costs per batch once workers load (inter-process transfer, unpickling; FIELD_NOTES): a job
without workers has never paid it, so a prediction for workers adds it, as its range's upper end and half of it
in the middle."""
WINDOW = 50
"""Steady iterations the advice reads at most: its medians steady over more of them than the verdict's window (which
is the least it needs)."""
ACCUMULATE = 4
"""Micro-batches per update that gradient accumulation is predicted for."""


class Kind(str, Enum):
    """What a candidate changes. The value is its name on screen and in the JSON."""

    BUCKETS = "gradient buckets"
    LOADER = "input pipeline"
    PINNED = "host-to-device copies"
    COMPRESSION = "gradient compression"
    ACCUMULATION = "gradient accumulation"
    STRAGGLER = "straggler"
    SCALE_OUT = "more workers"
    NETWORK = "faster network"

    def __str__(self) -> str:
        return self.value


class Confidence(str, Enum):
    """How far a candidate's prediction can be trusted."""

    VALIDATED = "validated"
    """Its kind of change met ±10 % of a real re-run in benchmarks/validate_advice.py."""
    LOWER = "lower"
    """Predicted, but not validated that well (the reason is given)."""
    WITHHELD = "withheld"
    """Not predicted: the model lacks what it needs (the reason is given)."""

    def __str__(self) -> str:
        return self.value


DOUBT: Mapping[Kind, str] = {
    Kind.PINNED: "not validated: the test machine has no GPU",
    Kind.SCALE_OUT: "not validated: the α-β fit is extrapolated to more ranks than ran, and the test machine's 2 "
                    "cores cannot run more ranks without measuring core sharing instead",
    Kind.NETWORK: "not validated: the test machine has one network (its loopback)",
}
"""Why a kind's predictions are of lower confidence (from benchmarks/validate_advice.py)."""
VALIDATED: frozenset[Kind] = frozenset()
"""The kinds whose predictions met the target against real re-runs (benchmarks/validate_advice.py); any other kind
without a :data:`DOUBT` is 'not validated yet'."""


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
        """``+23 %`` samples/s, or ``—`` when not predicted."""
        return "—" if self.throughput is None else f"{(self.throughput - 1) * 100:+.0f} %"


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

    @property
    def best(self) -> Candidate | None:
        """The fix put first, if it gains at least :data:`MIN_GAIN`: the one predicted to gain most among those
        that leave what the job computes alone, else the best of those with a caveat."""
        top = self.fixes[0] if self.fixes else None
        return top if top is not None and (top.throughput or 0) >= 1 + MIN_GAIN else None

    def headline(self) -> str:
        """The first line a person reads: the best change and its gain, or why there is none."""
        if self.held:
            return f"no advice yet: {self.held}"
        best = self.best
        if best is None:
            return (f"nothing to fix: no change to the job is predicted to gain {MIN_GAIN * 100:.0f} % or more "
                    f"(step {self.step_ms:.1f} ms)")
        assert best.step_ms is not None
        return (f"best change: {best.title} ({best.kind}): throughput {best.gain}, step {self.step_ms:.1f} → "
                f"{best.step_ms:.1f} ms")


@dataclass(frozen=True, slots=True)
class Window:
    """The steady iterations advised on, with what every candidate reads from them."""

    analyses: tuple[IterationAnalysis, ...]
    step_ms: float
    identity_ms: float
    ranks: int
    comm: AllReduce | None
    """The bucket all-reduces' α-β-κ fit over the window (:mod:`dagtop.model.allreduce`)."""

    def predicted(self, per_iteration: Sequence[float], fit: tuple[float, float] | None = None
                  ) -> tuple[float, float, tuple[float, float]]:
        """(speedup, step ms, range ms) from per-iteration replays with a change. The range is the 95 % interval of
        the median over the window (:func:`median_interval`), widened to ``fit``: the median replay with the α-β
        fit's β one standard error down and up, where the change rests on it."""
        median = statistics.median(per_iteration)
        speedup = self.identity_ms / median if median > 0 else math.inf
        lo, hi = median_interval(per_iteration)
        if fit is not None:
            lo, hi = min(lo, *fit), max(hi, *fit)
        scale = self.step_ms / self.identity_ms if self.identity_ms > 0 else 1.0
        return speedup, self.step_ms / speedup, (lo * scale, hi * scale)


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


def window_of(analyses: Sequence[IterationAnalysis]) -> list[IterationAnalysis]:
    """The iterations advised on: the last :data:`WINDOW` that count towards the verdict."""
    return [a for a in analyses if verdict.counts(a)][-WINDOW:]


def advise(analyses: Sequence[IterationAnalysis], ranks: Sequence[RankInfo] = (), buckets: Buckets | None = None,
           telemetry: Sequence[Telemetry] = ()) -> Advice:
    """Every candidate over the steady window of ``analyses`` (oldest first)."""
    chosen = window_of(analyses)
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
    ranks_now = len(chosen[-1].ranks)
    backwards = [b for b in map(backward_of, chosen) if b is not None]
    comm = fit([o for b in backwards for o in b.observed()], ranks_now)
    w = Window(tuple(chosen), step, statistics.median(a.predicted_ms for a in chosen), ranks_now, comm)
    units = {k for b in backwards for k in b.ready}
    layout = Layout.of(buckets, sorted(units)) if buckets is not None else None
    model = model_buckets(layout, backwards, comm) if (
        layout is not None and backwards and comm is not None and layout.mapped >= 0.5) else None
    found: list[Candidate] = []
    for make in _MAKERS:
        found.extend(make(w, layout, model, backwards, ranks, telemetry))
    predicted = [c for c in found if c.confidence is not Confidence.WITHHELD]
    buying = {Kind.SCALE_OUT, Kind.NETWORK}
    # A fix predicted to gain under MIN_GAIN is not worth the change (nor within what the model can tell), except
    # a "keep it as it is", which is advice too. Those that change what the job computes (numerics, the
    # optimisation) come after those that do not, whatever they gain: the user decides on them.
    gaining = sorted((c for c in predicted if c.kind not in buying), key=lambda c: -(c.throughput or 0))
    little = tuple(c for c in gaining if c.setting and (c.throughput or 0) < 1 + MIN_GAIN)
    fixes = [c for c in gaining if c not in little and not c.caveat] + [c for c in gaining
                                                                         if c not in little and c.caveat]
    buys = [c for c in predicted if c.kind in buying]
    withheld = [c for c in found if c.confidence is Confidence.WITHHELD]
    return Advice(len(chosen), needed, step, error, "", tuple(fixes), tuple(buys), tuple(withheld), model, last,
                  little)


def advise_snapshot(snap: Snapshot) -> Advice:
    """:func:`advise` on everything a snapshot holds."""
    return advise(snap.iterations, snap.ranks, snap.buckets, snap.telemetry)


Maker = Callable[[Window, Layout | None, BucketModel | None, Sequence[Backward], Sequence[RankInfo],
                  Sequence[Telemetry]], list[Candidate]]


def _confidence(kind: Kind) -> tuple[Confidence, str]:
    if kind in VALIDATED:
        return Confidence.VALIDATED, ""
    return Confidence.LOWER, DOUBT.get(kind, "not validated yet against a re-run")


def _withheld(kind: Kind, title: str, why: str) -> Candidate:
    return Candidate(kind, title, "", confidence=Confidence.WITHHELD, doubt=why)


def _path(a: IterationAnalysis, category: str) -> float:
    return segments_ms(a.critical_path).get(category, 0.0)


def _buckets(w: Window, layout: Layout | None, model: BucketModel | None, backwards: Sequence[Backward],
             ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> list[Candidate]:
    """The gradient buckets: the grouping of :mod:`dagtop.model.buckets` predicted best, or 'keep them'."""
    if not any(c.name.startswith("bucket ") for a in w.analyses for c in a.collectives):
        return []
    title = "bucket_cap_mb"
    if layout is None:
        return [_withheld(Kind.BUCKETS, title, "no bucket map with its parameters' sizes (DDP has not rebuilt its "
                                               "buckets yet, or the ranks run a shim older than this monitor)")]
    if layout.mapped < 0.5:
        return [_withheld(Kind.BUCKETS, title, f"only {layout.mapped * 100:.0f} % of the gradients' bytes belong to "
                                               "timed blocks: their backward times are unknown")]
    if model is None or w.comm is None or not backwards:
        return [_withheld(Kind.BUCKETS, title, "no backward timed with its buckets in the window")]
    if model.error > MAX_REPLAY_ERROR:
        return [_withheld(Kind.BUCKETS, title, f"the bucket schedule replays the all-reduces {model.error * 100:.1f} % "
                                               f"of the step off what was observed (over {MAX_REPLAY_ERROR * 100:.0f} %)")]
    now = model.now.median_ms
    tolerance = NEAR * w.identity_ms
    default = model.tried[0]
    # Groupings that rest on a latency the fit never saw (many buckets far smaller than any observed) are not advised.
    best = min((g for g in model.tried if not g.extrapolated), key=lambda g: g.median_ms, default=default)
    if default.median_ms <= best.median_ms + tolerance:
        best = default
    elif "bucket_cap_mb_list" in best.setting:
        uniform = min((g for g in model.tried[1:] if "bucket_cap_mb" in g.setting and not g.extrapolated),
                      key=lambda g: g.median_ms, default=None)
        if uniform is not None and uniform.median_ms <= best.median_ms + tolerance:
            best = uniform
    confidence, doubt = _confidence(Kind.BUCKETS)
    scale = w.step_ms / w.identity_ms if w.identity_ms > 0 else 1.0
    evidence = (f"{len(layout.now)} buckets now; the schedule replays their all-reduces {model.error * 100:.1f} % "
                f"of the step off the observed ({w.comm.describe()}); {len(model.tried)} groupings replayed on "
                f"{model.iterations} iterations: " + ", ".join(
                    f"{g.label.split(' (')[0]} {g.median_ms * scale:.1f} ms" + (" (latency extrapolated)"
                                                                               if g.extrapolated else "")
                    for g in sorted(model.tried, key=lambda g: g.median_ms)[:4]))
    if best.counts == layout.now or now - best.median_ms < MIN_GAIN * w.identity_ms:
        keep = "keep DDP's default buckets" if model.default else "keep the buckets as they are"
        return [Candidate(Kind.BUCKETS, keep, "no change: " + (
            "DDP's default (1 MiB first bucket, then 25 MiB) is as good as any grouping tried" if model.default else
            f"no grouping tried beats the current one by {MIN_GAIN * 100:.0f} %"),
            {}, w.step_ms, None, 1.0, evidence=evidence, confidence=confidence, doubt=doubt)]
    speedup, step, bounds = w.predicted(best.step_ms, best.bounds_ms)
    args = ", ".join(f"{k}={v}" for k, v in best.setting.items())
    change = (f"DistributedDataParallel(model, {args})" if args else
              "DistributedDataParallel(model) with no bucket_cap_mb (DDP's default)")
    title = (f"bucket_cap_mb_list, {len(best.counts)} buckets (MG-WFBP)" if "bucket_cap_mb_list" in best.setting
             else best.label.split(" (")[0] if args else "DDP's default buckets")
    return [Candidate(Kind.BUCKETS, title, change, dict(best.setting), step, bounds, speedup,
                      evidence=evidence + f"; {len(best.counts)} buckets with it", confidence=confidence, doubt=doubt)]


def _loader(w: Window, layout: Layout | None, model: BucketModel | None, backwards: Sequence[Backward],
            ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> list[Candidate]:
    """DataLoader workers from the fetch time per batch against the step without its wait, capped by the cores
    per rank; ``pin_memory`` where host-to-device copies hold the path."""
    out: list[Candidate] = []
    io = [_path(a, "io") for a in w.analyses]
    if statistics.median(io) >= MIN_GAIN * w.identity_ms:
        out.append(_workers(w, io, ranks, telemetry))
    pcie = [_path(a, "pcie") for a in w.analyses]
    if statistics.median(pcie) >= MIN_GAIN * w.identity_ms and any(r.device.startswith("cuda") for r in ranks):
        loader = next((r.loader for r in ranks if r.loader is not None), None)
        if loader is None or not loader.pin_memory:
            speedup, step, bounds = w.predicted([a.predicted_ms - p for a, p in zip(w.analyses, pcie)])
            confidence, doubt = _confidence(Kind.PINNED)
            out.append(Candidate(Kind.PINNED, "pin_memory=True, non_blocking copies",
                                 "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)",
                                 {"pin_memory": True}, step, bounds, speedup,
                                 evidence=f"copies hold {statistics.median(pcie):.1f} ms of the path per iteration",
                                 confidence=confidence, doubt=doubt))
    return out


def _workers(w: Window, io: Sequence[float], ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> Candidate:
    """Workers make batches beside the step: with w of them a batch comes every f/w, and the step is never shorter
    than itself plus a worker's transfer. Their CPU work lands on the training core where the host has no core to
    spare for them (the cores per rank, less the one training takes)."""
    loader = next((r.loader for r in ranks if r.loader is not None), None)
    if loader is None:
        return _withheld(Kind.LOADER, "num_workers", "the job's loader is not known: give the DataLoader to "
                                                     "tracer.loader() so dagtop sees its num_workers")
    rows = [max((r.io_ms for r in a.per_rank), default=0.0) for a in w.analyses]
    # The time a batch takes to make: all of the wait without workers; with w0 workers each makes one every w0 steps.
    fetch = [x if loader.workers == 0 else loader.workers * a.measured_ms for x, a in zip(rows, w.analyses)]
    without = [a.predicted_ms - x for a, x in zip(w.analyses, io)]
    # How much of making a batch is CPU work: measured on the training thread when it made them itself; else
    # anything from none to all of it.
    share = (loader.wait_cpu_permille / 1000 if loader.workers == 0 and loader.wait_cpu_permille is not None
             else None)
    cores = _cores_per_rank(ranks, telemetry)
    spare = math.inf if cores is None else max(cores - 1, 0)
    transfer = 0.0 if loader.workers else WORKER_TRANSFER_MS

    def steps(n: int, cpu_share: float, extra: float) -> list[float]:
        landed = cpu_share * max(0.0, 1 - spare / n)
        return [max(s + extra + f * landed, f / n) for s, f in zip(without, fetch)]

    middle = share if share is not None else 0.5
    tried = {n: statistics.median(steps(n, middle, transfer / 2)) for n in range(loader.workers + 1,
                                                                                  loader.workers + 9)}
    fastest = min(tried.values())
    workers = min(n for n, ms in tried.items() if ms <= fastest * (1 + MIN_GAIN / 2))
    lo = steps(workers, share if share is not None else 0.0, 0.0)
    hi = steps(workers, share if share is not None else 1.0, transfer)
    speedup, step, bounds = w.predicted(steps(workers, middle, transfer / 2),
                                        (statistics.median(lo), statistics.median(hi)))
    confidence, doubt = _confidence(Kind.LOADER)
    if share is None and confidence is Confidence.VALIDATED:
        confidence, doubt = Confidence.LOWER, ("how much of making a batch is CPU work is not known (workers make "
                                               "them now, or an older shim): the range spans none to all of it")
    extra = ", persistent_workers=True" if not loader.persistent_workers else ""
    said = "unknown" if share is None else f"{share * 100:.0f} %"
    host = "not known" if cores is None else f"{cores} per rank, {spare:g} to spare"
    return Candidate(Kind.LOADER, f"num_workers={workers}", f"DataLoader(..., num_workers={workers}{extra})",
                     {"num_workers": workers, "persistent_workers": True}, step, bounds, speedup,
                     evidence=(f"loading holds {statistics.median(io):.1f} ms of the path per iteration; a batch takes "
                               f"{statistics.median(fetch):.1f} ms to make ({said} of it CPU work), the step without "
                               f"waiting for it {statistics.median(without):.1f} ms; {loader.workers} workers now; "
                               f"the host's cores: {host}"),
                     confidence=confidence, doubt=doubt)


def _cores_per_rank(ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> int | None:
    """The fewest CPUs per rank over the hosts (from the telemetry), None where no host says."""
    per_host: dict[str, int] = {}
    for r in ranks:
        per_host[r.host] = per_host.get(r.host, 0) + 1
    cpus = {t.host: t.host_stats.cpus for t in telemetry if t.host_stats is not None and t.host_stats.cpus}
    known = [cpus[h] // n for h, n in per_host.items() if h in cpus]
    return max(min(known), 1) if known else None


def _volume(w: Window, layout: Layout | None, model: BucketModel | None, backwards: Sequence[Backward],
            ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> list[Candidate]:
    """Fewer bytes (bf16 compression) or fewer all-reduces (accumulation), where communication is exposed."""
    exposed = statistics.median(a.exposed_comm_ms for a in w.analyses)
    if exposed < MIN_GAIN * w.identity_ms:
        return []
    out: list[Candidate] = []
    gpu = any(r.device.startswith(("cuda", "xpu")) for r in ranks)
    if not gpu:
        out.append(_withheld(Kind.COMPRESSION, "fp16_compress_hook", CPU_COMPRESSION))
    elif layout is not None and w.comm is not None and backwards and model is not None:
        half = [s // 2 for s in layout.sizes]
        saved = {b.iteration: finish_ns(layout, layout.now, b, w.comm)
                 - finish_ns(layout, layout.now, b, w.comm, half) for b in backwards}
        mid = [b.identity_ms - saved[b.iteration] / 1e6 for b in backwards]
        speedup, step, bounds = w.predicted(mid)
        confidence, doubt = _confidence(Kind.COMPRESSION)
        hook = "bf16_compress_hook"  # DDP's refuses anything but NCCL or XCCL: GPU ranks here
        numerics = "bfloat16 (8 bits of mantissa)"
        out.append(Candidate(
            Kind.COMPRESSION, hook,
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            f"ddp.register_comm_hook(None, default_hooks.{hook})", {"comm_hook": hook},
            step, bounds, speedup, evidence=f"{exposed:.1f} ms of communication exposed per iteration; each bucket "
                                            "sends half its bytes (the α-β fit), its latency unchanged",
            confidence=confidence, doubt=doubt,
            caveat=f"changes numerics: gradients are summed in {numerics}; the hook also replaces DDP's built-in "
                   "all-reduce, which costs a cast and a division per bucket on the training thread"))
    free = {a.iteration: next((x.iteration_ms for x in a.what_if if x.change is Change.PERFECT_OVERLAP), None)
            for a in w.analyses}
    if all(v is not None for v in free.values()):
        k = ACCUMULATE
        per = [(k - 1) * max(float(free[a.iteration] or 0.0) - _update_ms(a), 0.0) + a.predicted_ms
               for a in w.analyses]
        speedup, step, bounds = w.predicted(per)
        confidence, doubt = _confidence(Kind.ACCUMULATION)
        out.append(Candidate(
            Kind.ACCUMULATION, f"accumulate {k} micro-batches",
            f"for i, batch in enumerate(loader):\n    with (ddp.no_sync() if i % {k} != {k - 1} else nullcontext()):\n"
            f"        loss(ddp(batch)).backward()\n    if i % {k} == {k - 1}: opt.step(); opt.zero_grad()",
            {"accumulate": k}, step, bounds, speedup, samples=k,
            evidence=(f"{exposed:.1f} ms of communication exposed per iteration; {k - 1} of {k} micro-batches "
                      "replayed without their all-reduces (the 'perfect overlap' replay) nor their update"),
            confidence=confidence, doubt=doubt,
            caveat=f"changes the optimisation: {k}× the samples per update (scale the learning rate, or give each "
                   f"micro-batch 1/{k} of the batch, which this prediction does not cover)"))
    return out


CPU_COMPRESSION = ("not advised on CPU ranks: the hook casts every bucket to float16 and back on the training "
                   "thread and gloo sums float16 in software, which cost more than the halved bytes save (re-run on "
                   "4 CPU jobs: ×0.76 to ×0.97 measured where ×1.12 to ×1.47 was predicted; "
                   "benchmarks/validate_advice.py)")
"""Why the compression hook is not advised on CPU (gloo) ranks: measured, not assumed."""


def _update_ms(a: IterationAnalysis) -> float:
    return sum(s.duration_ms for s in a.critical_path if s.phase == "update")


def _straggler(w: Window, layout: Layout | None, model: BucketModel | None, backwards: Sequence[Backward],
               ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> list[Candidate]:
    """The steady verdict's straggler: where it loses its time, and the gain of bringing it to the median."""
    steady = w.analyses[-1].steady
    s = steady.straggler if steady is not None else None
    if s is None:
        return []
    per = []
    for a in w.analyses:
        x = next((x.iteration_ms for x in a.what_if if x.change is Change.STRAGGLER_AT_MEDIAN), None)
        mine = a.straggler is not None and a.straggler.rank == s.rank
        per.append(x if x is not None and mine else a.predicted_ms)
    speedup, step, bounds = w.predicted(per)
    host = next((r.host for r in ranks if r.rank == s.rank), "")
    load = next((t.host_stats.cpu_percent for t in telemetry
                 if t.host == host and t.host_stats is not None and t.host_stats.cpu_percent is not None), None)
    cause, action = _CAUSES.get(s.category, _CAUSES["other"])
    if s.category == "compute" and load is not None and load >= 90:
        cause = f"host contention: its host {host} is {load:.0f} % busy"
        action = f"find what else runs on {host} beside rank {s.rank} (top, ps) and move it, or move the rank"
    confidence, doubt = _confidence(Kind.STRAGGLER)
    return [Candidate(Kind.STRAGGLER, f"rank {s.rank} to the median", action.format(rank=s.rank), {"rank": s.rank},
                      step, bounds, speedup,
                      evidence=(f"rank {s.rank} last to the collectives in {s.late} of {steady.iterations} "  # type: ignore[union-attr]
                                f"iterations, {s.busy_excess_ms:+.1f} ms busy against the others' median; it loses "
                                f"the time in {s.category}: {cause}"),
                      confidence=confidence, doubt=doubt)]


_CAUSES = {
    "compute": ("its forward and backward run slower",
                ("find why rank {rank} computes slower (another process on its cores or GPU, thermal throttling, "
                 "a slower device)")),
    "io": ("it waits longer for its data", "give rank {rank}'s loader more workers, or move its data closer"),
    "pcie": ("its host-to-device copies are slower",
             "check rank {rank}'s PCIe link (nvidia-smi -q: link width and generation) and pin its batches"),
    "other": ("untimed host work (Python, garbage collection, logging)",
              "profile rank {rank}'s host side (py-spy dump) for work the others do not do"),
}


def _scale(w: Window, layout: Layout | None, model: BucketModel | None, backwards: Sequence[Backward],
           ranks: Sequence[RankInfo], telemetry: Sequence[Telemetry]) -> list[Candidate]:
    """2N and 4N workers (weak scaling) and a faster network, from the what-ifs and the α-β fit."""
    out = []
    confidence, doubt = _confidence(Kind.SCALE_OUT)
    twice = [next((x for x in a.what_if if x.change is Change.DOUBLE_WORKERS), None) for a in w.analyses]
    if all(x is not None for x in twice):
        per2 = [x.iteration_ms for x in twice if x is not None]
        speedup, step, bounds = w.predicted(per2)
        out.append(Candidate(Kind.SCALE_OUT, f"{2 * w.ranks} workers (2N)", f"run on {2 * w.ranks} ranks, the same batch "
                             "per rank", {"workers": 2 * w.ranks}, step, bounds, speedup, workers=2,
                             evidence="each collective longer by the α-β fit at twice the ranks (the '2N workers' "
                                      "what-if)", confidence=confidence, doubt=doubt))
        if layout is not None and w.comm is not None and backwards:
            more = {b.iteration: finish_ns(layout, layout.now, b, w.comm.at(4 * w.ranks))
                    - finish_ns(layout, layout.now, b, w.comm.at(2 * w.ranks)) for b in backwards}
            per4 = [x + more.get(a.iteration, 0.0) / 1e6 for x, a in zip(per2, w.analyses)]
            speedup, step, bounds = w.predicted(per4)
            out.append(Candidate(Kind.SCALE_OUT, f"{4 * w.ranks} workers (4N)", f"run on {4 * w.ranks} ranks, the same "
                                 "batch per rank", {"workers": 4 * w.ranks}, step, bounds, speedup, workers=4,
                                 evidence="the 2N prediction, plus what the buckets' schedule adds from 2N to 4N ranks "
                                          "on the α-β fit", confidence=confidence, doubt=doubt))
        else:
            out.append(_withheld(Kind.SCALE_OUT, f"{4 * w.ranks} workers (4N)", "needs the bucket map with its "
                                                                         "parameters' sizes"))
    net = [next((x for x in a.what_if if x.change is Change.NETWORK), None) for a in w.analyses]
    if all(x is not None for x in net) and net:
        first = net[-1]
        assert first is not None
        speedup, step, bounds = w.predicted([x.iteration_ms for x in net if x is not None])
        c, d = _confidence(Kind.NETWORK)
        out.append(Candidate(Kind.NETWORK, first.label, f"a network of {first.bandwidth_gbps:.3g} GB/s bus bandwidth "
                             "(--bandwidth to try another)", {"bus_gbps": first.bandwidth_gbps}, step, bounds,
                             speedup, evidence="each collective's per-byte time redone at that bandwidth (the "
                                               "'network bandwidth' what-if)", confidence=c, doubt=d))
    return out


_MAKERS: tuple[Maker, ...] = (_buckets, _loader, _volume, _straggler, _scale)
