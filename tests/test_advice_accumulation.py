"""The advisor's gradient accumulation: a micro-batch under ``no_sync`` priced from the training threads' CPU time
on CPU ranks, else replayed without its collectives; the copies it saves, the adds it pays, and where it is held
back."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
from comm_heavy import COMM_HEAVY, run, with_thread_cpu

from dagtop.model import advice as advice_module
from dagtop.model.advice import Kind, advise, advise_snapshot
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis


def test_accumulation_on_cpu_ranks_also_frees_the_cpu_the_all_reduces_took_beside_the_backward() -> None:
    """gloo reduces on the ranks' cores: a micro-batch under no_sync gives the backward back the CPU its all-reduces
    did beside it, on CPU ranks only. On COMM_HEAVY the first bucket (2 MiB: 0.5 + 2 ms of work) all-reduces beside
    the 40 ms backward, so at least that much is freed per micro-batch. (Simulated one all-reduce at a time, the
    cut this price rests on; the same iterations said to be of CPU ranks and of GPU ranks.)"""
    snap = run(dataclasses.replace(COMM_HEAVY, device="cuda:0"))
    cpu_ranks = [dataclasses.replace(r, device="cpu") for r in snap.ranks]
    cpu = next(c for c in advise(snap.iterations, cpu_ranks, snap.buckets, snap.telemetry).fixes
               if c.kind is Kind.ACCUMULATION)
    gpu = next(c for c in advise_snapshot(snap).fixes if c.kind is Kind.ACCUMULATION)
    assert "CPU their all-reduces took" in cpu.evidence and "CPU" not in gpu.evidence
    freed = float(cpu.evidence.split("nor the ")[1].split(" ms")[0])
    assert 2.5 <= freed <= 40.0
    assert cpu.step_ms is not None and gpu.step_ms is not None
    # Three micro-batches of the four give it back (the step shown is the measured one over the replayed speedup).
    assert gpu.step_ms - cpu.step_ms == pytest.approx(3 * freed, rel=0.25)


def test_accumulation_saves_the_bucket_copies_and_pays_the_adds_the_shim_timed() -> None:
    """DDP copies every gradient into its bucket and back on a synced step, which no_sync skips; each micro-batch
    after the first adds its gradients to those accumulated: the times a rank's bucket map carries come off (and
    on) three of the four micro-batches, and the evidence says so."""
    snap = run(COMM_HEAVY)
    plain = next(c for c in advise_snapshot(snap).fixes if c.kind is Kind.ACCUMULATION)
    assert snap.buckets is not None and snap.buckets.copy_ns == 0 and "copies" not in plain.evidence
    timed = dataclasses.replace(snap, buckets=dataclasses.replace(snap.buckets, copy_ns=4_000_000, add_ns=1_500_000))
    less = next(c for c in advise_snapshot(timed).fixes if c.kind is Kind.ACCUMULATION)
    assert "4.0 ms of DDP's copies of the gradients" in less.evidence and "1.5 ms of adding" in less.evidence
    assert plain.step_ms is not None and less.step_ms is not None
    assert plain.step_ms - less.step_ms == pytest.approx(3 * (4.0 - 1.5), rel=0.1)  # the step of four micro-batches


def test_accumulation_is_withheld_with_the_reason_where_the_replay_without_collectives_was_refused() -> None:
    """The what-ifs that change communication are refused where compute ran clearly faster under collectives: the
    accumulation that rests on one of them is withheld with that reason, never predicted infinitely fast."""
    snap = run(COMM_HEAVY)
    why = "compute ran faster while a collective was in flight (main ×0.60 ± 0.05), which the model cannot explain"

    def refused(a: IterationAnalysis) -> IterationAnalysis:
        return dataclasses.replace(a, what_if=tuple(
            dataclasses.replace(x, iteration_ms=math.nan, speedup=math.nan, unpredictable=why)
            if x.change is Change.PERFECT_OVERLAP else x for x in a.what_if))

    advice = advise(list(map(refused, snap.iterations)), snap.ranks, snap.buckets, snap.telemetry)
    assert not any(c.kind is Kind.ACCUMULATION for c in (*advice.fixes, *advice.buys))
    held = next(c for c in advice.withheld if c.kind is Kind.ACCUMULATION)
    assert held.doubt == why and held.speedup is None


def test_the_predictions_are_for_the_job_without_dagtops_own_time_in_its_hooks() -> None:
    """On CPU ranks dagtop's hooks run inside the step: the time each rank says they took comes out of the step now
    and out of each pass of the changed step (four for accumulation: its micro-batches each pay it) before they are
    divided, and the advice says how much it took out. Where one rank did not say it (an older shim), nothing is."""
    snap = run(COMM_HEAVY)
    window = advice_module.window_of(snap.iterations)
    identity = statistics.median(a.predicted_ms for a in window)
    plain = advise_snapshot(with_thread_cpu(snap, 30.0, 0.5))
    own = advise_snapshot(with_thread_cpu(snap, 30.0, 0.5, shim_ms=2.0))
    assert plain.shim_ms == 0.0 and not plain.without_dagtop
    assert own.shim_ms == pytest.approx(2.0) and own.without_dagtop == (
        "predicted without dagtop's own 2.0 ms a step in its hooks")
    for kind, passes in ((Kind.ACCUMULATION, 4), (Kind.BUCKETS, 1)):
        before = next(c for c in plain.fixes if c.kind is kind)
        after = next(c for c in own.fixes if c.kind is kind)
        assert before.speedup is not None and after.speedup is not None and before.step_ms is not None
        changed = identity / before.speedup  # the median replay with the change, as the advice had it
        assert after.speedup == pytest.approx((identity - 2.0) / (changed - passes * 2.0), rel=1e-6)
        assert after.speedup > before.speedup
        assert after.step_ms == pytest.approx(plain.step_ms / after.speedup, rel=1e-6)  # the step measured with dagtop
    timed = with_thread_cpu(snap, 30.0, 0.5, shim_ms=2.0)
    older = {it: {r: cpu._replace(shim_ns=0) if r == 1 else cpu for r, cpu in ranks.items()}
             for it, ranks in timed.thread_cpu.items()}
    partly = advise_snapshot(dataclasses.replace(timed, thread_cpu=older))
    assert partly.shim_ms == 0.0 and partly.fixes == plain.fixes


def test_ddps_launches_of_its_all_reduces_come_off_each_micro_batch_and_off_each_bucket_fewer() -> None:
    """DDP hands each bucket to the process group from the training thread, inside the backward: ``no_sync`` makes
    no launch, and a grouping of fewer buckets makes fewer. The time the ranks said their launches took comes off
    each micro-batch's CPU work (here 3 ms at half a core: 6 ms a micro-batch, three micro-batches of four), and a
    launch's share of it (3 ms over the buckets now) off the backward for each bucket fewer than now."""
    snap = run(COMM_HEAVY)
    window = advice_module.window_of(snap.iterations)
    identity = statistics.median(a.predicted_ms for a in window)
    step = statistics.median(a.measured_ms for a in window)
    plain, launched = (advise_snapshot(with_thread_cpu(snap, 30.0, 0.5, launch_ms=ms)) for ms in (0.0, 3.0))
    before, after = (next(c for c in a.fixes if c.kind is Kind.ACCUMULATION) for a in (plain, launched))
    assert before.step_ms is not None and after.step_ms is not None
    assert after.step_ms == pytest.approx(before.step_ms - step * 3 * 6.0 / identity, rel=1e-6)
    assert "3.0 ms of launching the all-reduces" in after.evidence and "launching" not in before.evidence
    assert plain.buckets is not None and launched.buckets is not None
    now = len(plain.buckets.layout.now)
    assert plain.buckets.launch_ns == 0 and launched.buckets.launch_ns == pytest.approx(3e6 / now)
    bucket = next(c for c in launched.fixes if c.kind is Kind.BUCKETS)
    assert f"each bucket's launch (DDP's call into the process group) {3e3 / now:.0f} µs" in bucket.evidence
    moved = [(len(g.counts), h.median_ms - g.median_ms) for g, h in zip(plain.buckets.tried, launched.buckets.tried)]
    assert any(ms < 0 for n, ms in moved if n < now)  # the backward ends a launch sooner for each bucket fewer
    assert launched.buckets.now.step_ms == plain.buckets.now.step_ms  # the buckets now: as replayed


def test_accumulation_on_cpu_ranks_prices_a_micro_batch_from_the_training_threads_cpu_time() -> None:
    """Where every rank measured its training thread's CPU time, a micro-batch under no_sync is its CPU work (less
    the update's, the loader's and DDP's copies, plus the adds) at the share of a core the thread had in its
    updates, plus its wait for data, the slowest rank's: not the wall-clock replay, which keeps compute slowed by
    gloo's threads on shared cores. Where a rank did not measure it (an older shim), the replay prices it."""
    snap = run(COMM_HEAVY)
    replayed = next(c for c in advise_snapshot(snap).fixes if c.kind is Kind.ACCUMULATION)
    assert "'perfect overlap' replay" in replayed.evidence
    timed = dataclasses.replace(with_thread_cpu(snap, 30.0, 0.5),
                                buckets=dataclasses.replace(snap.buckets, copy_ns=4_000_000, add_ns=1_000_000))
    priced = next(c for c in advise_snapshot(timed).fixes if c.kind is Kind.ACCUMULATION)
    window = advice_module.window_of(snap.iterations)
    # (30 - 4 + 1) ms of work at half a core, and the wait for data, on the slowest rank
    micro = {a.iteration: max(row.io_ms for row in a.per_rank) + (30 - 4 + 1) / 0.5 for a in window}
    per = [3 * micro[a.iteration] + a.predicted_ms for a in window]
    identity = statistics.median(a.predicted_ms for a in window)
    step = statistics.median(a.measured_ms for a in window)
    assert priced.step_ms == pytest.approx(step * statistics.median(per) / identity, rel=1e-6)
    assert "priced from the training threads' CPU time: 27.0 ms" in priced.evidence
    assert "in their updates (50 % or more)" in priced.evidence
    assert priced.step_ms != pytest.approx(replayed.step_ms, rel=0.05)
    # One rank's times missing: the replay again.
    partly = next(c for c in advise_snapshot(with_thread_cpu(snap, 30.0, 0.5, ranks=(0,))).fixes
                  if c.kind is Kind.ACCUMULATION)
    assert partly.evidence == replayed.evidence and partly.step_ms == replayed.step_ms


def test_a_rank_whose_compute_is_slower_than_the_others_keeps_it_in_each_micro_batch() -> None:
    """What slows one rank's compute and not the others' (a CPU hog on its core) is not communication: no_sync keeps
    it, though the rank's update, run just after a wait for the all-reduces, had the core to itself. Rank 1 computes
    3 times slower: its micro-batch is its CPU work plus the compute it loses over rank 0 (the window's medians)."""
    snap = run(dataclasses.replace(COMM_HEAVY, slow_ranks=(1,), slow_category="compute", slow_factor=3.0))
    priced = next(c for c in advise_snapshot(with_thread_cpu(snap, 30.0, 1.0)).fixes if c.kind is Kind.ACCUMULATION)
    window = advice_module.window_of(snap.iterations)
    compute = {r: statistics.median(row.compute_ms for a in window for row in a.per_rank if row.rank == r)
               for r in (0, 1)}
    assert compute[1] > 2 * compute[0]
    micro = {a.iteration: max(row.io_ms + 30 + compute[row.rank] - compute[0] for row in a.per_rank) for a in window}
    per = [3 * micro[a.iteration] + a.predicted_ms for a in window]
    identity = statistics.median(a.predicted_ms for a in window)
    step = statistics.median(a.measured_ms for a in window)
    assert priced.step_ms == pytest.approx(step * statistics.median(per) / identity, rel=1e-6)
    assert f"rank 1's compute {compute[1] - compute[0]:.1f} ms over the fastest rank's" in priced.evidence
