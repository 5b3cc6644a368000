"""Communication volume's candidates: fewer bytes (DDP's compress hooks) or fewer all-reduces (gradient
accumulation, its micro-batches priced from the training threads' CPU time on CPU ranks)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from dagtop.model import trust
from dagtop.model.buckets import finish_ns
from dagtop.model.candidate import MIN_GAIN, Candidate, Kind, Window, withheld
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis

ACCUMULATE = 4
"""Micro-batches per update that gradient accumulation is predicted for."""
LOST_SAID = 0.01
"""A rank's compute over the fastest rank's is said in accumulation's evidence from this share of the step."""


def volume(w: Window) -> list[Candidate]:
    """Fewer bytes (bf16 compression) or fewer all-reduces (accumulation), where communication is exposed."""
    exposed = statistics.median(a.exposed_comm_ms for a in w.analyses)
    if exposed < MIN_GAIN * w.identity_ms:
        return []
    out: list[Candidate] = []
    gpu = any(r.device.startswith(("cuda", "xpu")) for r in w.infos)
    if not gpu:
        out.append(withheld(Kind.COMPRESSION, "fp16_compress_hook", CPU_COMPRESSION))
    elif w.layout is not None and w.comm is not None and w.backwards and w.buckets is not None:
        half = [s // 2 for s in w.layout.sizes]
        saved = {b.iteration: finish_ns(w.layout, w.layout.now, b, w.comm)
                 - finish_ns(w.layout, w.layout.now, b, w.comm, half) for b in w.backwards}
        mid = [b.identity_ms - saved[b.iteration] / 1e6 for b in w.backwards]
        speedup, step, bounds = w.predicted(mid)
        confidence, doubt = trust.confidence_of(Kind.COMPRESSION)
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
    if any(v is not None and math.isnan(v) for v in free.values()):  # the replay without collectives was refused
        why = w.unpredictable(Change.PERFECT_OVERLAP) or "the 'perfect overlap' replay was not made"
        out.append(withheld(Kind.ACCUMULATION, f"accumulate {ACCUMULATE} micro-batches", why))
    elif all(v is not None for v in free.values()):
        out.append(_accumulation(w, {i: float(v or 0.0) for i, v in free.items()}, exposed, gpu))
    return out


def _accumulation(w: Window, free: dict[int, float], exposed: float, gpu: bool) -> Candidate:
    """K micro-batches per update, K − 1 of them under ``no_sync``: on CPU ranks that measured their training
    thread's CPU time, each priced from it (:func:`_on_the_thread`); elsewhere each is the iteration replayed without its
    exposed communication (the 'perfect overlap' replay) and without its update; on CPU ranks also without the CPU
    its all-reduces took from the backward beside which they ran (gloo reduces on the ranks' cores): their work
    alone (the α-β fit) less what they did after the backward, within their time beside it; and without DDP's copies
    of the gradients into its buckets and back but with autograd's adding each micro-batch's gradients to those
    accumulated, where the shim timed them (``Window.copies_ms``, ``Window.adds_ms``: K − 1 of each per update)."""
    k = ACCUMULATE
    priced = None if gpu else _on_the_thread(w)
    if priced is not None:
        micro, how = priced
        per = [(k - 1) * micro[a.iteration] + a.predicted_ms for a in w.analyses]
        return _accumulating(w, per, exposed, how)
    beside: dict[int, float] = {}
    if not gpu and w.comm is not None:
        comm = w.comm
        beside = {b.iteration: sum(comm.done_beside(m, s, e, b.end) for m, s, e in b.collectives) / 1e6
                  for b in w.backwards}
    passes = w.copies_ms - w.adds_ms
    per = [(k - 1) * max(free[a.iteration] - _update_ms(a) - beside.get(a.iteration, 0.0) - passes, 0.0)
           + a.predicted_ms for a in w.analyses]
    cpu = (f", nor the {statistics.median(beside.values()):.1f} ms of CPU their all-reduces took from the backward "
           "beside it" if beside else "")
    if w.copies_ms or w.adds_ms:
        cpu += (f", nor the {w.copies_ms:.1f} ms of DDP's copies of the gradients into its buckets and back, but with "
                f"the {w.adds_ms:.1f} ms of adding them to those accumulated")
    # The 'perfect overlap' replay is a lower bound where CPU ranks share a host; accumulation's re-runs missed
    # both ways (its doubt), so no bound is claimed for it: said, not hidden.
    bounded = any(x.lower_bound for a in w.analyses for x in a.what_if if x.change is Change.PERFECT_OVERLAP)
    note = ("; the 'perfect overlap' replay is a lower bound on shared cores, but accumulation's re-runs missed both "
            "ways: no bound claimed" if bounded else "")
    return _accumulating(w, per, exposed, f"{k - 1} of {k} micro-batches replayed without their all-reduces (the "
                                          f"'perfect overlap' replay){cpu}, nor their update{note}")


def _on_the_thread(w: Window) -> tuple[dict[int, float], str] | None:
    """A micro-batch under ``no_sync`` on CPU ranks, per iteration, from what each rank's training thread did: its
    CPU work (its CPU time less the update's, the loader's, DDP's copies and its launches of the buckets'
    all-reduces, with the adds accumulation makes), stretched by whichever is more, the share of a core the thread
    had in its updates (where no collective runs) or the time its compute took over the fastest rank's (the
    window's medians), plus its wait for data; the slowest rank's. None unless every rank measured every iteration of
    the window.

    What slows one rank's compute and not the others' is another process on its cores (``no_sync`` keeps it) or the
    job's own threads landing there unevenly (gloo's, of any rank: ``no_sync`` idles them). Where its host says how
    busy it is, no more of it is kept than the CPU that host gave to processes not the ranks'
    (:meth:`~dagtop.model.candidate.Window.foreign_ms`): on the 41-layer MLP of benchmarks/validate_advice.py a rank
    lost 3.1 ms a step with none to other processes, and accumulation's re-run took 7.2 ms a micro-batch where 12.2
    ms was priced with it kept; the monitor recording it took 1.6 % of a core.

    A synced step's all-reduces run on gloo's threads beside the training thread: on shared cores its compute takes
    longer by the wall clock than by its own CPU time, which a replay of the wall-clock tasks keeps and no fit over
    steps that all communicate can take out (:mod:`dagtop.model.interference`). A thread that waits for the
    all-reduces gets the core first when it wakes, so its share in the update flatters a core it shares with another
    process (a CPU hog): the compute it loses over the other ranks' shows that one."""
    if not w.analyses or any(set(a.ranks) - set(w.thread_cpu.get(a.iteration, ())) for a in w.analyses):
        return None
    update_cpu: dict[int, int] = {}
    update_wall: dict[int, int] = {}
    for a in w.analyses:
        for r, cpu in w.thread_cpu[a.iteration].items():
            update_cpu[r] = update_cpu.get(r, 0) + cpu.update_ns
            update_wall[r] = update_wall.get(r, 0) + sum(t.duration_ns for t in a.tasks.by_rank.get(r, ())
                                                         if t.phase == "update")
    share = {r: min(update_cpu[r] / update_wall[r], 1.0) if update_wall[r] and update_cpu[r] else 1.0
             for r in update_cpu}
    over = w.compute_over_fastest()
    host = {r.rank: r.host for r in w.infos}
    foreign = {h: w.foreign_ms(h) for h in set(host.values())}
    kept = {r: ms if (cap := foreign.get(host.get(r, ""))) is None else min(ms, cap) for r, ms in over.items()}
    micro: dict[int, float] = {}
    works: list[float] = []
    for a in w.analyses:
        io = {row.rank: row.io_ms for row in a.per_rank}
        each = []
        for r in a.ranks:
            cpu = w.thread_cpu[a.iteration][r]
            work = max((cpu.total_ns - cpu.update_ns - cpu.load_ns - cpu.launch_ns) / 1e6 - w.copies_ms + w.adds_ms,
                       0.0)
            works.append(work)
            each.append(io.get(r, 0.0) + max(work / share[r], work + kept.get(r, 0.0)))
        micro[a.iteration] = max(each)
    slowest = max(over, key=over.__getitem__, default=None)
    lost = "" if slowest is None or over[slowest] < LOST_SAID * w.identity_ms else (
        f", rank {slowest}'s compute {over[slowest]:.1f} ms over the fastest rank's" + (
            "" if kept[slowest] >= over[slowest] else
            f" ({kept[slowest]:.1f} ms of it kept: the CPU its host {host[slowest]} gave a step to processes not the "
            "ranks'; the rest went to the job's own threads, which no_sync idles)"))
    how = (f"{ACCUMULATE - 1} of {ACCUMULATE} micro-batches priced from the training threads' CPU time: "
           f"{statistics.median(works):.1f} ms a rank that is not the update, the loader, nor DDP's "
           f"{w.copies_ms:.1f} ms of copies" + (f" and {w.launch_ms:.1f} ms of launching the all-reduces"
                                                   if w.launch_ms else "") +
           f" (with the {w.adds_ms:.1f} ms of adding gradients to those accumulated), "
           f"stretched by the share of a core the threads had in their updates ({min(share.values()) * 100:.0f} % "
           f"or more){lost}, plus the wait for data: {statistics.median(micro.values()):.1f} ms a micro-batch")
    return micro, how


def _accumulating(w: Window, per: Sequence[float], exposed: float, how: str) -> Candidate:
    """The accumulation candidate from its replayed updates (``per``: one per iteration of the window)."""
    k = ACCUMULATE
    speedup, step, bounds = w.predicted(per, samples=k)
    confidence, doubt = trust.accumulation(w, speedup * k)
    return Candidate(
        Kind.ACCUMULATION, f"accumulate {k} micro-batches",
        f"for i, batch in enumerate(loader):\n    with (ddp.no_sync() if i % {k} != {k - 1} else nullcontext()):\n"
        f"        loss(ddp(batch)).backward()\n    if i % {k} == {k - 1}: opt.step(); opt.zero_grad()",
        {"accumulate": k}, step, bounds, speedup, samples=k,
        evidence=f"{exposed:.1f} ms of communication exposed per iteration; {how}",
        confidence=confidence, doubt=doubt,
        caveat=f"changes the optimisation: {k}× the samples per update (scale the learning rate, or give each "
               f"micro-batch 1/{k} of the batch, which this prediction does not cover)")


CPU_COMPRESSION = ("not advised on CPU ranks: the hook casts every bucket to float16 and back on the training "
                   "thread and gloo sums float16 in software, which cost more than the halved bytes save (re-run on "
                   "4 CPU jobs: ×0.76 to ×0.97 measured where ×1.12 to ×1.47 was predicted; "
                   "benchmarks/validate_advice.py)")
"""Why the compression hook is not advised on CPU (gloo) ranks: measured, not assumed."""


def _update_ms(a: IterationAnalysis) -> float:
    return sum(s.duration_ms for s in a.critical_path if s.phase == "update")
