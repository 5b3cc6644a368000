"""The candidate changes, each made from the window of steady iterations: gradient buckets, the input pipeline,
communication volume, the straggler, and buying (more workers, a faster network)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from dagtop.model import trust, verdict
from dagtop.model.analysis import segments_ms
from dagtop.model.bucket_map import MIB
from dagtop.model.buckets import REACH, finish_ns
from dagtop.model.candidate import (
    MAX_REPLAY_ERROR,
    MIN_GAIN,
    Candidate,
    Confidence,
    Kind,
    Window,
    cores_per_rank,
    withheld,
)
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis, RankInfo
from dagtop.model.volume import volume
from dagtop.model.whatif import cohosts, waits_on_shared_cores
from instrument.wire import Telemetry

NEAR = 0.01
"""Two bucket groupings within this share of the step are as good as each other: the simpler one is named."""
BUCKET_MARGIN = 0.10
"""A grouping is advised over the current one, or over DDP's default, only where the schedule predicts it faster by
this share of the step: as far as the bucket advice has been seen to err against its re-runs
(benchmarks/validate_advice.py on a 2-core CPU host, load 2-3: predicted gains +7 to +17.5 % over the measured in
4 of 4, and groupings predicted 2 % and 3 % faster than DDP's default measured 6 % slower)."""
CONTENDED = 0.25
"""A compute straggler's host is named contended where it gives processes not the ranks' at least this share of a
core over the step (:meth:`Window.foreign_ms`, where the ranks measure their threads' CPU): two CPU ranks with
gloo's threads keep a 2-core host 86-98 % busy by themselves; over 36 recordings of jobs without a hog it gave
other processes -3 to +3.5 ms a step in 26 and up to a third to a half of a core in 4 (a shared machine); a CPU hog
beside the ranks took 10-17 ms of 16-23 ms steps with the host 84-88 % busy (benchmarks/validate_advice.py,
2026-11-29)."""
BUSY = 90
"""Elsewhere (GPU ranks: no thread CPU), a compute straggler's host is named contended from this % busy."""
WORKER_TRANSFER_MS = 1.7
"""What ``next()`` costs per batch once workers load (inter-process transfer, unpickling; FIELD_NOTES): a job
without workers has never paid it, so a prediction for workers adds it, as its range's upper end and half of it
in the middle."""
MIN_SIZES = 3
"""Distinct bucket sizes the all-reduce fit needs before bucket sizes are weighed: with fewer, an all-reduce's
latency cannot be told from its per-byte cost, nor from its slowdown under the backward."""
UNTOLD = ("the buckets seen have {sizes} size(s): an all-reduce's latency cannot be told from its per-byte cost, "
          "nor from its slowdown under the backward, so other bucket sizes cannot be weighed (re-run on CPU jobs "
          "with two sizes: ×1.16 and ×1.46 measured where ×1.02 and ×1.00 were predicted; "
          "benchmarks/validate_advice.py)")
"""Why the bucket advice is withheld below :data:`MIN_SIZES`: measured, not assumed."""
MIN_T = 2.0
"""How many standard errors above 0 the fit's per-byte time must be before bucket sizes are weighed: below it the
all-reduces' durations do not grow with their size beyond their noise, and the fit puts what they take into the
latency, which every merge then saves (an MLP of tiny buckets, 2-core CPU host: per-byte 0.03 ± 0.22, 0.07 ± 0.11
and 0.31 ± 0.26 ns a byte, a 1 MB cap predicted ×1.45, ×1.26 and ×1.47, re-run ×1.03, ×1.06 and ×1.14;
benchmarks/validate_advice.py, 2026-11-29)."""


def _path(a: IterationAnalysis, category: str) -> float:
    return segments_ms(a.critical_path).get(category, 0.0)


def _buckets(w: Window) -> list[Candidate]:
    """The gradient buckets: the grouping of :mod:`dagtop.model.buckets` predicted best, or 'keep them'."""
    if not any(c.name.startswith("bucket ") for a in w.analyses for c in a.collectives):
        return []
    title = "bucket_cap_mb"
    if w.layout is None:
        return [withheld(Kind.BUCKETS, title, "no bucket map with its parameters' sizes (DDP has not rebuilt its "
                                               "buckets yet, or the ranks run a shim older than this monitor)")]
    if w.layout.mapped < 0.5:
        return [withheld(Kind.BUCKETS, title, f"only {w.layout.mapped * 100:.0f} % of the gradients' bytes belong to "
                                               "timed blocks: their backward times are unknown")]
    if w.buckets is None or w.comm is None or not w.backwards:
        return [withheld(Kind.BUCKETS, title, "no backward timed with its buckets in the window")]
    if w.buckets.comm.sizes < MIN_SIZES:
        return [withheld(Kind.BUCKETS, title, UNTOLD.format(sizes=w.buckets.comm.sizes))]
    fitted = w.buckets.comm
    if fitted.b_ns_per_byte <= 0 or fitted.b_ns_per_byte < MIN_T * fitted.b_se:
        return [withheld(Kind.BUCKETS, title, f"the all-reduces' durations do not grow with their size beyond their "
                                               f"noise (per-byte time {fitted.b_ns_per_byte:.3f} ± {fitted.b_se:.3f} "
                                               f"ns a byte over {fitted.sizes} sizes): the latency a merge saves cannot "
                                               "be told from the per-byte cost, so other bucket sizes cannot be weighed")]
    if w.buckets.error > MAX_REPLAY_ERROR:
        return [withheld(Kind.BUCKETS, title, f"the bucket schedule replays the all-reduces {w.buckets.error * 100:.1f} % "
                                               f"of the step off what was observed (over {MAX_REPLAY_ERROR * 100:.0f} %)")]
    now = w.buckets.now.median_ms
    tolerance = NEAR * w.identity_ms
    margin = BUCKET_MARGIN * w.identity_ms
    default = w.buckets.tried[0]
    # Groupings that rest on a latency the fit never saw (many buckets far smaller than any observed) or on a
    # per-byte time it never saw (a bucket far larger) are not advised.
    reach = [g for g in w.buckets.tried if not g.extrapolated and not g.beyond]
    best = min(reach, key=lambda g: g.median_ms, default=w.buckets.now)
    # DDP's default is named where it is as good as the best, within what the advice errs, unless it is not as
    # far ahead of the buckets now as the best is: then the best is advised, not a keep.
    if not default.beyond and default.median_ms <= best.median_ms + margin and (
            default.counts == w.layout.now or now - default.median_ms >= margin):
        best = default
    elif "bucket_cap_mb_list" in best.setting:
        uniform = min((g for g in reach if "bucket_cap_mb" in g.setting), key=lambda g: g.median_ms, default=None)
        if uniform is not None and uniform.median_ms <= best.median_ms + tolerance:
            best = uniform
    scale = w.step_ms / w.identity_ms if w.identity_ms > 0 else 1.0
    launch = (f"; each bucket's launch (DDP's call into the process group) {w.buckets.launch_ns / 1e3:.0f} µs of the "
              "backward's thread, one saved with each bucket fewer" if w.buckets.launch_ns else "")
    if w.buckets.steal:
        launch += (f"; gloo's threads reduce on the rank's cores, none to spare: {w.buckets.steal:.2f} ms of the "
                   "backward lost per ms of all-reduce work beside it (their CPU time a step over the fit's work), "
                   "given back by a grouping that runs less there")
    evidence = (f"{len(w.layout.now)} buckets now; the schedule replays their all-reduces {w.buckets.error * 100:.1f} % "
                f"of the step off the observed ({w.buckets.comm.describe()}){launch}; {len(w.buckets.tried)} groupings "
                "replayed on "
                f"{w.buckets.iterations} iterations: " + ", ".join(
                    f"{g.label.split(' (')[0]} {g.median_ms * scale:.1f} ms" + (
                        " (latency extrapolated)" if g.extrapolated else " (per-byte time extrapolated)" if g.beyond
                        else "")
                    for g in sorted(w.buckets.tried, key=lambda g: g.median_ms)[:4]))
    far = min((g for g in w.buckets.tried if g.beyond and not g.extrapolated), key=lambda g: g.median_ms,
              default=None)
    if far is not None and far.median_ms < min(best.median_ms, now) - margin:
        largest = w.buckets.comm.largest / MIB
        beyond = (f"larger buckets are predicted faster still ({far.label.split(' (')[0]} "
                  f"{far.median_ms * scale:.1f} ms), on a per-byte time the fit never saw: their buckets are over "
                  f"{REACH:g}× the largest all-reduce timed ({largest:.2g} MiB)")
        if best.counts == w.layout.now or now - best.median_ms < margin:
            return [withheld(Kind.BUCKETS, title, f"{beyond}; a recording with bucket_cap_mb={REACH * largest:.2g} "
                                                  "would time buckets that large. " + evidence)]
        evidence += f"; {beyond}, not advised"
    if best.counts == w.layout.now or now - best.median_ms < margin:
        keep = "keep DDP's default buckets" if w.buckets.default else "keep the buckets as they are"
        confidence, doubt = trust.buckets(w, keep=True)
        return [Candidate(Kind.BUCKETS, keep, "no change: " + (
            "no grouping tried beats DDP's default (1 MiB first bucket, then 25 MiB)" if w.buckets.default else
            "no grouping tried beats the current one") + f" by {BUCKET_MARGIN * 100:.0f} % of the step, as far as "
            "the bucket advice has been seen to err against its re-runs",
            {}, w.step_ms, None, 1.0, evidence=evidence, confidence=confidence, doubt=doubt)]
    speedup, step, bounds = w.predicted(best.step_ms, best.bounds_ms)
    confidence, doubt = trust.buckets(w, keep=False)
    args = ", ".join(f"{k}={v}" for k, v in best.setting.items())
    change = (f"DistributedDataParallel(model, {args})" if args else
              "DistributedDataParallel(model) with no bucket_cap_mb (DDP's default)")
    title = (f"bucket_cap_mb_list, {len(best.counts)} buckets (MG-WFBP)" if "bucket_cap_mb_list" in best.setting
             else best.label.split(" (")[0] if args else "DDP's default buckets")
    return [Candidate(Kind.BUCKETS, title, change, dict(best.setting), step, bounds, speedup,
                      evidence=evidence + f"; {len(best.counts)} buckets with it", confidence=confidence, doubt=doubt)]


def _loader(w: Window) -> list[Candidate]:
    """DataLoader workers from the fetch time per batch against the step without its wait, capped by the cores
    per rank; ``pin_memory`` where host-to-device copies hold the path."""
    out: list[Candidate] = []
    io = [_path(a, "io") for a in w.analyses]
    if statistics.median(io) >= MIN_GAIN * w.identity_ms:
        out.append(_workers(w, io, w.infos, w.telemetry))
    pcie = [_path(a, "pcie") for a in w.analyses]
    if statistics.median(pcie) >= MIN_GAIN * w.identity_ms and any(r.device.startswith("cuda") for r in w.infos):
        loader = next((r.loader for r in w.infos if r.loader is not None), None)
        if loader is None or not loader.pin_memory:
            speedup, step, bounds = w.predicted([a.predicted_ms - p for a, p in zip(w.analyses, pcie)])
            confidence, doubt = trust.confidence_of(Kind.PINNED)
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
        return withheld(Kind.LOADER, "num_workers", "the job's loader is not known: give the DataLoader to "
                                                     "tracer.loader() so dagtop sees its num_workers")
    rows = [max((r.io_ms for r in a.per_rank), default=0.0) for a in w.analyses]
    # The time a batch takes to make: all of the wait without workers; with w0 workers each makes one every w0 steps.
    fetch = [x if loader.workers == 0 else loader.workers * a.measured_ms for x, a in zip(rows, w.analyses)]
    without = [a.predicted_ms - x for a, x in zip(w.analyses, io)]
    # How much of making a batch is CPU work: measured on the training thread when it made them itself; else
    # anything from none to all of it.
    share = (loader.wait_cpu_permille / 1000 if loader.workers == 0 and loader.wait_cpu_permille is not None
             else None)
    cores = cores_per_rank(ranks, telemetry)
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
    confidence, doubt = trust.confidence_of(Kind.LOADER)
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


def _straggler(w: Window) -> list[Candidate]:
    """The straggler as the verdict's rule names it over the advice's window, or over as many of the iterations
    before it as make it last 2 s (as the live verdict does; ``report`` judges its whole range): where it loses its
    time, and the gain of bringing it to the median."""
    s = verdict.advance(None, w.analyses, w.history).straggler
    if s is None:
        return []
    # The verdict's own 'straggler at median' replays of that rank (its time in its category down to the others'
    # median), from the iterations that made them, so that the advice and the report's what-if say one figure.
    having = [(a, x) for a in w.analyses for x in a.what_if
              if x.change is Change.STRAGGLER_AT_MEDIAN and x.rank == s.rank and x.predictable]
    title = f"rank {s.rank} to the median"
    if not having:
        return [withheld(Kind.STRAGGLER, title, f"no iteration of the window replayed rank {s.rank} at the median "
                                                "(the live verdict had not named it there)")]
    speedup, step, bounds = w.predicted([x.iteration_ms for _, x in having], base=[a.predicted_ms for a, _ in having])
    host = next((r.host for r in w.infos if r.rank == s.rank), "")
    load = next((t.host_stats.cpu_percent for t in w.telemetry
                 if t.host == host and t.host_stats is not None and t.host_stats.cpu_percent is not None), None)
    cause, action = _CAUSES.get(s.category, _CAUSES["other"])
    foreign = w.foreign_ms(host)
    step = statistics.median(a.measured_ms for a in w.analyses)
    if s.category == "compute" and load is not None and (
            load >= BUSY if foreign is None else foreign >= CONTENDED * step):
        cause = f"host contention: its host {host} is {load:.0f} % busy" + (
            "" if foreign is None else f", {foreign:.1f} ms of CPU a step going to processes not the ranks'")
        action = f"find what else runs on {host} beside rank {s.rank} (top, ps) and move it, or move the rank"
    confidence, doubt = trust.confidence_of(Kind.STRAGGLER)
    shared = cohosts({r.rank: (r.host, r.device) for r in w.infos}).get(s.rank)
    if s.category == "io" and shared is not None:
        confidence, doubt = Confidence.LOWER, waits_on_shared_cores(s.rank, shared)
    # Where the replay is a lower bound (a compute straggler on cores other ranks share), so is the advice on it.
    lower = next((x.lower_bound for _, x in reversed(having) if x.lower_bound), "")
    return [Candidate(Kind.STRAGGLER, title, action.format(rank=s.rank), {"rank": s.rank}, step, bounds, speedup,
                      evidence=(f"the verdict's straggler: {s.describe()} against the others' median (above it in "
                                f"{s.above} of {s.iterations} iterations, sign test p {s.p_value:.2g}), "
                                f"{s.busy_excess_ms:+.1f} ms busy; it loses the time in {s.category}: {cause}"),
                      confidence=confidence, doubt=doubt, lower_bound=lower)]


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


def _scale(w: Window) -> list[Candidate]:
    """2N and 4N workers (weak scaling) and a faster network, from the what-ifs and the α-β fit."""
    out = []
    confidence, doubt = trust.confidence_of(Kind.SCALE_OUT)
    # Iterations before the α-β fit had a collective past warm-up have no scaling what-if: the others are read.
    having = [(a, x) for a in w.analyses for x in a.what_if if x.change is Change.DOUBLE_WORKERS and x.predictable]
    why = w.unpredictable(Change.DOUBLE_WORKERS)
    if why and len(having) < len(w.analyses) / 2:
        out.append(withheld(Kind.SCALE_OUT, f"{2 * w.ranks} workers (2N)", why))
    if len(having) >= len(w.analyses) / 2:
        base = [a.predicted_ms for a, _ in having]
        per2 = [x.iteration_ms for _, x in having]
        speedup, step, bounds = w.predicted(per2, base=base)
        out.append(Candidate(Kind.SCALE_OUT, f"{2 * w.ranks} workers (2N)", f"run on {2 * w.ranks} ranks, the same batch "
                             "per rank", {"workers": 2 * w.ranks}, step, bounds, speedup, workers=2,
                             evidence="each collective longer by the α-β fit at twice the ranks (the '2N workers' "
                                      "what-if)", confidence=confidence, doubt=doubt))
        if w.layout is not None and w.comm is not None and w.backwards:
            more = {b.iteration: finish_ns(w.layout, w.layout.now, b, w.comm.at(4 * w.ranks))
                    - finish_ns(w.layout, w.layout.now, b, w.comm.at(2 * w.ranks)) for b in w.backwards}
            per4 = [x + more.get(a.iteration, 0.0) / 1e6 for x, (a, _) in zip(per2, having)]
            speedup, step, bounds = w.predicted(per4, base=base)
            out.append(Candidate(Kind.SCALE_OUT, f"{4 * w.ranks} workers (4N)", f"run on {4 * w.ranks} ranks, the same "
                                 "batch per rank", {"workers": 4 * w.ranks}, step, bounds, speedup, workers=4,
                                 evidence="the 2N prediction, plus what the buckets' schedule adds from 2N to 4N ranks "
                                          "on the α-β fit", confidence=confidence, doubt=doubt))
        else:
            out.append(withheld(Kind.SCALE_OUT, f"{4 * w.ranks} workers (4N)", "needs the bucket map with its "
                                                                         "parameters' sizes"))
    net = [(a, x) for a in w.analyses for x in a.what_if if x.change is Change.NETWORK and x.predictable]
    why = w.unpredictable(Change.NETWORK)
    if why and len(net) < len(w.analyses) / 2:
        out.append(withheld(Kind.NETWORK, "faster network", why))
    if net and len(net) >= len(w.analyses) / 2:
        first = net[-1][1]
        speedup, step, bounds = w.predicted([x.iteration_ms for _, x in net], base=[a.predicted_ms for a, _ in net])
        c, d = trust.confidence_of(Kind.NETWORK)
        out.append(Candidate(Kind.NETWORK, first.label, f"a network of {first.bandwidth_gbps:.3g} GB/s bus bandwidth "
                             "(--bandwidth to try another)", {"bus_gbps": first.bandwidth_gbps}, step, bounds,
                             speedup, evidence="each collective's per-byte time redone at that bandwidth (the "
                                               "'network bandwidth' what-if)", confidence=c, doubt=d))
    return out


MAKERS: tuple[Callable[[Window], list[Candidate]], ...] = (_buckets, _loader, volume, _straggler, _scale)
"""Each kind of change, made from the window: zero or more candidates each."""
