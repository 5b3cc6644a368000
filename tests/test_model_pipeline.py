"""Pipeline.feed on good, bad, duplicated, missing and clock-shifted input."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire


def job_frames(ranks: int = 2, iterations: int = 5, **kw: object) -> list[RawFrame]:
    return synthetic_frames(SyntheticJob(ranks=ranks, **kw), iterations=iterations)  # type: ignore[arg-type]


def test_clean_job_is_analysed_complete() -> None:
    p = Pipeline()
    p.feed(job_frames(iterations=5))
    snap = p.snapshot()
    assert [a.iteration for a in snap.iterations] == [0, 1, 2, 3, 4]
    assert all(a.complete for a in snap.iterations)
    assert (snap.rejected, snap.dropped, snap.incomplete) == (0, 0, 0)
    assert snap.ranks_expected == 2 and [r.rank for r in snap.ranks] == [0, 1]
    assert snap.iterations_per_s > 0
    assert p.snapshot() is snap  # cached until something changes


def test_bad_frames_are_counted_with_reasons_and_good_ones_kept() -> None:
    good = job_frames(iterations=3)
    wrong_version = msgpack.packb({"v": 99, "k": "bye", "seq": 0, "rank": 0, "iterations": 0, "dropped": 0})
    unknown_rank = wire.encode_iteration(0, 7, 0, [], 0)
    bad = [RawFrame(1, b"\xc1garbage"), RawFrame(2, wrong_version), RawFrame(3, b"")]
    p = Pipeline()
    p.feed(good[:2] + bad + good[2:] + [RawFrame(4, unknown_rank)])
    snap = p.snapshot()
    assert snap.rejected == 4
    assert "rank 7 is not below the world size 2" in (snap.last_rejection or "")
    assert len(snap.iterations) == 3 and all(a.complete for a in snap.iterations)
    p2 = Pipeline()
    p2.feed([RawFrame(1, wrong_version)])
    assert "wire version 99 is not supported" in (p2.snapshot().last_rejection or "")


def test_duplicates_are_ignored_and_sequence_gaps_count_as_dropped() -> None:
    frames = job_frames(iterations=4)
    p = Pipeline()
    p.feed(frames + frames[3:6])
    assert p.duplicates == 3
    assert p.snapshot().rejected == 0 and p.snapshot().dropped == 0
    assert len(p.analyses()) == 4
    # Lose rank 1's iteration 1: one gap in its sequence; the iteration is analysed without it.
    lost = next(i for i, f in enumerate(frames)
                if isinstance(x := wire.decode(f.payload), wire.IterationBatch) and (x.rank, x.iteration) == (1, 1))
    q = Pipeline()
    q.feed(frames[:lost] + frames[lost + 1:])
    snap = q.snapshot()
    assert snap.dropped == 1
    assert snap.incomplete == 1
    one = next(a for a in snap.iterations if a.iteration == 1)
    assert not one.complete and one.ranks == (0,)


def test_a_rank_that_never_reports_makes_incomplete_iterations_after_the_timeout() -> None:
    frames = [f for f in job_frames(ranks=3, iterations=3)
              if not (isinstance(x := wire.decode(f.payload), wire.IterationBatch) and x.rank == 2)]
    p = Pipeline(incomplete_after_s=5.0)
    p.feed(frames)
    assert p.analyses() == []  # still waiting: the monitor clock has not moved 5 s
    last = frames[-1].received_ns
    p.feed([RawFrame(last + 6_000_000_000, wire.encode(wire.Bye(99, 0, 3, 0)))])
    snap = p.snapshot()
    assert snap.incomplete == 3
    assert all(not a.complete and a.ranks == (0, 1) for a in snap.iterations)


def test_finish_analyses_what_is_pending() -> None:
    frames = [f for f in job_frames(ranks=2, iterations=2)
              if not (isinstance(x := wire.decode(f.payload), wire.IterationBatch) and x.rank == 1)]
    p = Pipeline()
    p.feed(frames)
    p.finish()
    snap = p.snapshot()
    assert snap.finished and snap.incomplete == 2 and len(snap.iterations) == 2


def test_frames_before_any_hello_are_held_until_the_world_size_is_known() -> None:
    frames = job_frames(iterations=2)
    hellos = [f for f in frames if isinstance(wire.decode(f.payload), wire.Hello)]
    rest = [f for f in frames if f not in hellos]
    p = Pipeline()
    p.feed(rest)
    assert p.analyses() == [] and p.snapshot().rejected == 0
    assert any("held" in n for n in p.snapshot().notes)
    p.feed(hellos)
    assert len(p.analyses()) == 2
    q = Pipeline(expected_ranks=2)
    q.feed(rest)  # no hello at all, but the world size is known
    assert len(q.analyses()) == 2


def _shift_host(frames: list[RawFrame], ranks: set[int], shift_ns: int, wall_error_ns: int) -> list[RawFrame]:
    out = []
    for f in frames:
        x = wire.decode(f.payload)
        if x.rank in ranks:
            if isinstance(x, wire.Hello):
                x = dataclasses.replace(x, host="other-host", mono_ns=x.mono_ns + shift_ns,
                                        wall_ns=x.wall_ns + wall_error_ns)
            elif isinstance(x, wire.IterationBatch):
                x = dataclasses.replace(x, events=tuple(
                    e._replace(start_ns=e.start_ns + shift_ns, end_ns=e.end_ns + shift_ns) for e in x.events))
        out.append(RawFrame(f.received_ns, wire.encode(x)))
    return out


def test_clock_offset_of_another_host_is_estimated_from_collective_ends() -> None:
    job = dict(ranks=4, iterations=6, slow_ranks=(3,), slow_category="io")
    plain = Pipeline()
    plain.feed(job_frames(**job))  # type: ignore[arg-type]
    shifted = Pipeline()
    shift = 5_000_000_000
    shifted.feed(_shift_host(job_frames(**job), {2, 3}, shift, wall_error_ns=3_000_000))  # type: ignore[arg-type]
    snap = shifted.snapshot()
    offsets = {r.rank: r.clock_offset_ns for r in snap.ranks}
    assert offsets[0] == offsets[1] == 0
    assert offsets[2] == offsets[3] == pytest.approx(-shift, abs=1_000)
    assert any("other-host" in n and "collective end times" in n for n in snap.notes)
    for a, b in zip(plain.analyses()[1:], shifted.analyses()[1:]):
        assert b.measured_ms == pytest.approx(a.measured_ms, rel=1e-3)
        assert b.straggler is not None and a.straggler is not None and b.straggler.rank == a.straggler.rank == 3
        assert b.bottleneck == a.bottleneck


def test_the_training_threads_cpu_times_are_kept_for_the_latest_iterations_of_the_ranks_that_send_them() -> None:
    """A CPU rank's iteration frame carries its training thread's CPU times: the snapshot holds them by iteration and
    rank for the last THREAD_CPU_KEPT iterations (the advice's window and a margin), and nothing for a rank that
    sends none (a GPU rank, an older shim)."""
    from dagtop.model.advice import WINDOW
    from dagtop.model.pipeline import THREAD_CPU_KEPT

    iterations = THREAD_CPU_KEPT + 30
    frames = []
    for raw in job_frames(iterations=iterations):
        frame = wire.decode(raw.payload)
        if isinstance(frame, wire.IterationBatch) and frame.rank == 0:
            frame = dataclasses.replace(frame, cpu_ns=10_000 + frame.iteration, update_cpu_ns=2, load_cpu_ns=1)
            raw = RawFrame(raw.received_ns, wire.encode(frame))
        frames.append(raw)
    p = Pipeline(window=None)
    p.feed(frames)
    kept = p.snapshot().thread_cpu
    assert WINDOW < THREAD_CPU_KEPT
    assert sorted(kept) == list(range(iterations - THREAD_CPU_KEPT, iterations))
    assert all(set(by_rank) == {0} and by_rank[0] == wire.ThreadCpu(10_000 + it, 2, 1) for it, by_rank in kept.items())
