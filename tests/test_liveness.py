"""Liveness on synthetic frames: silent, waiting, gone and restarted ranks, and the stalls recorded."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.frames import hello
from test_ui_helpers import fake_telemetry, wait_loaded

from dagtop.io.recording import RecordingWriter
from dagtop.io.sources import RecordingSource
from dagtop.model.frames import RawFrame
from dagtop.model.liveness import Liveness, pid_alive
from dagtop.model.liveness_view import Holder, LivenessView, OpenTask, Restart, ranks_text
from dagtop.model.pipeline import Pipeline
from dagtop.ui.app import make_app
from dagtop.ui.widgets.verdict import Verdict
from instrument import wire
from instrument.events import TaskState

S = 1_000_000_000
OPEN, IN_COLLECTIVE, BETWEEN = TaskState.OPEN, TaskState.COLLECTIVE, TaskState.BETWEEN


def _hello(rank: int, pid: int, seq: int = 0, host: str = "elsewhere") -> wire.Hello:
    return hello(rank, 2, seq, host=host, pid=pid, wall_ns=0, mono_ns=0)


def _iter(rank: int, it: int, seq: int) -> wire.IterationBatch:
    return wire.IterationBatch(seq, rank, it, [("compute", "forward", "f", "main", 0, 5, 0)], 0)


def _run(live: Liveness, until_s: float, stop_rank_1_at_s: float | None = None) -> None:
    """Two ranks, 0.1 s iterations and heartbeats each second, from t=0 to ``until_s``; rank 1 silent from
    ``stop_rank_1_at_s`` on, and rank 0 then stuck in an all-reduce."""
    live.take(_hello(0, 100), 0)
    live.take(_hello(1, 101), 0)
    t, it, seq = 0.1, 0, 1
    while t < until_s:
        stopped = stop_rank_1_at_s is not None and t >= stop_rank_1_at_s
        if not stopped:
            live.take(_iter(0, it, seq), int(t * S))
            live.take(_iter(1, it, seq), int(t * S))
            it += 1
        if abs(t - round(t)) < 0.05:  # about every second
            task = "all-reduce bucket 0" if stopped else "forward layers.0"
            live.take(wire.Heartbeat(seq + 1, 0, it, task, 5, state=IN_COLLECTIVE if stopped else OPEN), int(t * S))
            if not stopped:
                live.take(wire.Heartbeat(seq + 1, 1, it, "backward layers.3", 5, state=OPEN), int(t * S))
        seq += 2
        t += 0.1


def _frames_of_a_stall() -> list[RawFrame]:
    """The frames of :func:`_run` up to 15 s, rank 1 silent from 3 s, as a recording holds them."""
    frames: list[RawFrame] = []
    recorder = Liveness()
    recorder.take = lambda frame, ns: frames.append(RawFrame(ns, wire.encode(frame)))  # type: ignore[method-assign]
    _run(recorder, until_s=15.0, stop_rank_1_at_s=3.0)
    return frames


def test_a_silent_rank_during_a_stall_holds_the_job_and_the_others_wait() -> None:
    live = Liveness()
    _run(live, until_s=20.0, stop_rank_1_at_s=5.0)
    view = live.assess(20 * S)
    assert [rank for rank, _, _ in view.silent] == [1]
    assert view.silent[0][1] > 10
    [holder] = view.holders
    assert (holder.rank, holder.task) == (1, "backward layers.3") and holder.silent_s > 10
    assert view.waiting == (("all-reduce bucket 0", (0,)),)
    line = view.line()
    assert line.startswith("rank 1 holds the job: silent 1")
    assert "(last: backward layers.3) · rank 0 waiting in all-reduce bucket 0" in line
    [stall] = live.stalls
    assert ([h.rank for h in stall.holders], stall.holders[0].task, stall.resumed) == ([1], "backward layers.3", False)
    assert stall.waiting == (("all-reduce bucket 0", (0,)),)
    assert stall.iteration == 50  # where rank 0 waits
    # It comes back and the job goes on: the stall is over, its record kept, resumed.
    live.take(wire.Heartbeat(999, 1, stall.iteration, "backward layers.3", 5, state=OPEN), 21 * S)
    live.take(_iter(0, 500, 1000), 21 * S)
    live.take(_iter(1, 500, 1000), 21 * S)
    assert live.assess(21 * S).line() == ""
    [stall] = live.stalls
    assert stall.resumed and stall.stalled_s > 14 and stall.holders[0].silent_s > 14
    # The stalled iteration's analysis confirms it (16 s long, within a step of where the others waited); another
    # iteration of that time would be a stall no frame showed.
    assert not live.settle(49, 100.0)
    assert live.settle(49, 16_000.0) and live.stalls[0].iteration == 49 and live.stalls[0].confirmed
    assert live.settle(49, 16_000.0) and not live.settle(50, 100.0)


def test_a_rank_heard_outside_any_collective_holds_the_job() -> None:
    """Rank 1 asleep in its loader, still sending heartbeats; rank 0 blocked in the all-reduce: rank 1 holds the
    job though it is not silent, and the stall is recorded."""
    live = Liveness()
    _run(live, until_s=5.0)
    for t in range(5, 45):
        live.take(wire.Heartbeat(2000 + t, 0, 50, "all-reduce bucket 0", (t - 5) * 1000, state=IN_COLLECTIVE), t * S)
        live.take(wire.Heartbeat(3000 + t, 1, 50, "loader next", (t - 5) * 1000 + 300, state=OPEN), t * S)
    view = live.assess(44 * S + S // 2)
    assert view.silent == () and view.stalled_s > 30
    assert view.line() == "rank 1 holds the job: in loader next for 40 s · rank 0 waiting in all-reduce bucket 0"
    [stall] = live.stalls
    assert (stall.iteration, [(h.rank, h.task) for h in stall.holders]) == (50, [(1, "loader next")])
    assert stall.waiting == (("all-reduce bucket 0", (0,)),) and not stall.resumed
    live.take(_iter(0, 50, 9000), 45 * S)
    live.take(_iter(1, 50, 9000), 45 * S)
    live.assess(45 * S)
    assert live.stalls[0].resumed and live.settle(50, 40_100.0)


def test_a_stall_that_resumes_and_ends_between_two_looks_is_resumed() -> None:
    """The ranks come back, do an iteration and say bye within one look (0.5 s): the stall went on, not killed."""
    live = Liveness()
    _run(live, until_s=10.0, stop_rank_1_at_s=3.0)
    live.assess(10 * S)
    for rank in (0, 1):
        live.take(_iter(rank, 100, 5000), 10 * S + 100)
        live.take(wire.Bye(5001, rank, 101, 0), 10 * S + 200)
    live.assess(10 * S + S // 4)
    [stall] = live.stalls
    assert stall.resumed


def test_a_silent_holder_heard_again_before_its_iteration_keeps_its_silence_in_the_record() -> None:
    """Rank 1, stopped, comes back: its heartbeat (in backward) arrives a look before its iteration does. The record
    says what held the job (silent 12 s), not the last look's 'in backward for 13 s' (its task's clock ran on while
    it was frozen)."""
    live = Liveness()
    _run(live, until_s=15.0, stop_rank_1_at_s=3.0)
    live.assess(15 * S)
    live.take(wire.Heartbeat(10_000, 1, 30, "backward layers.3", 13_000, state=OPEN), 16 * S)
    live.take(wire.Heartbeat(10_001, 0, 30, "all-reduce bucket 0", 13_000, state=IN_COLLECTIVE), 16 * S)
    assert live.assess(16 * S + S // 2).stalled_s  # still stalled: no iteration done since
    [stall] = live.stalls
    [holder] = stall.holders
    assert (holder.rank, holder.task, holder.silent_s >= 12) == (1, "backward layers.3", True), holder
    assert stall.waiting == (("all-reduce bucket 0", (0,)),)
    for rank in (0, 1):
        live.take(_iter(rank, 30, 10_002), 17 * S)
    live.assess(17 * S)
    assert live.stalls[0].resumed and live.stalls[0].holders[0].silent_s >= 12


def test_a_stall_whose_last_iterations_come_within_one_look_is_resumed_when_the_recording_ends() -> None:
    """The ranks come back and the recording ends before the next look (0.5 s): judged as of its last frame."""
    frames = _frames_of_a_stall()
    seq = 20_000
    for it in (30, 31, 32):
        for rank in (0, 1):
            frames.append(RawFrame(15 * S + it * 1_000_000, wire.encode(_iter(rank, it, seq))))
            seq += 1
    pipeline = Pipeline(window=None)
    pipeline.feed(frames)
    pipeline.finish()
    [stall] = pipeline.liveness.stalls
    assert stall.resumed and [h.rank for h in stall.holders] == [1], stall


def test_a_rank_silent_before_its_first_heartbeat_is_placed_after_its_last_task() -> None:
    live = Liveness()
    live.take(_hello(0, 100), 0)
    live.take(_hello(1, 101), 0)
    for it in range(12):
        live.take(_iter(0, it, it), it * S // 10)
        live.take(_iter(1, it, it), it * S // 10)
    for t in range(2, 13):  # rank 1 sends no heartbeat (an older shim): only its frames said where it was
        live.take(wire.Heartbeat(100 + t, 0, 12, "all-reduce bucket 0", t * 1000, state=IN_COLLECTIVE), t * S)
    view = live.assess(12 * S)
    assert [(h.rank, h.task) for h in view.holders] == [(1, "after f")]
    assert view.line().startswith("rank 1 holds the job: silent 1")


def test_a_long_iteration_no_frame_showed_is_a_stall_too() -> None:
    live = Liveness()
    _run(live, until_s=5.0)
    assert not live.settle(60, 120.0)
    assert live.settle(61, 9_000.0)  # past 5 median iterations and 3 s
    [stall] = live.stalls
    assert (stall.iteration, stall.holders, stall.confirmed, stall.resumed) == (61, (), True, True)


def test_a_steady_job_has_no_stall_and_no_line() -> None:
    live = Liveness()
    _run(live, until_s=20.0)
    assert live.assess(20 * S).line() == ""
    assert live.stalls == []


def test_a_slow_job_is_not_a_stall_until_several_iterations_long() -> None:
    live = Liveness()
    live.take(_hello(0, 100), 0)
    for it in range(5):  # 10 s iterations, heartbeats in between
        for s in range(10):
            live.take(wire.Heartbeat(it * 10 + s, 0, it, "forward layers.0", s * 1000, state=OPEN), (it * 10 + s) * S)
        live.take(_iter(0, it, it * 10 + 9), (it * 10 + 10) * S)
    assert live.assess(58 * S).stalled_s == 0  # 8 s without an iteration: less than 5 medians of 10 s


def test_a_rank_whose_process_is_gone_is_gone_and_one_that_says_bye_is_not_a_stall() -> None:
    live = Liveness(alive=lambda pid: pid != 101)
    live.take(_hello(0, 100, host=_here()), 0)
    live.take(_hello(1, 101, host=_here()), 0)
    assert live.assess(1 * S).gone == ()  # pids are looked up only when asked (a live monitor)
    assert live.assess(1 * S, check_pids=True).gone == ((1, "process gone"),)
    assert "rank 1 gone (process gone)" in live.view.line()
    ended = Liveness()
    ended.take(_hello(0, 100), 0)
    ended.take(wire.Bye(1, 0, 10, 0), S)
    assert ended.assess(30 * S).line() == ""  # every rank said bye: the job ended


def test_a_new_pid_for_a_known_rank_is_a_restart_back_to_its_first_iteration() -> None:
    live = Liveness()
    live.take(_hello(0, 100), 0)
    for it in range(5):
        live.take(_iter(0, it, it + 1), (it + 1) * S)
    live.take(_hello(0, 200), 10 * S)
    assert live.restarts == [Restart(0, 100, 200, None)]
    live.take(_iter(0, 0, 1), 11 * S)
    assert live.restarts == [Restart(0, 100, 200, 0)]
    assert "rank 0 restarted (pid 100 → 200, iteration 0)" in live.assess(11 * S).line()
    assert live.assess(100 * S).restarted == () and live.restarts  # shown for a minute, kept for the report


def test_ranks_restarted_together_each_get_their_first_iteration() -> None:
    live = Liveness()
    for rank in (0, 1):
        live.take(_hello(rank, 100 + rank), 0)
        live.take(_iter(rank, 3, 1), S)
    for rank in (0, 1):
        live.take(_hello(rank, 200 + rank), 2 * S)
    for rank in (0, 1):
        live.take(_iter(rank, 0, 1), 3 * S)
    assert live.restarts == [Restart(0, 100, 200, 0), Restart(1, 101, 201, 0)]
    assert "ranks 0-1 restarted" in live.assess(3 * S).line()


def test_iterations_going_back_in_the_same_process_are_a_restart() -> None:
    live = Liveness()
    live.take(_hello(0, 100), 0)
    for it in range(5):
        live.take(_iter(0, it, it + 1), (it + 1) * S)
    live.take(_iter(0, 0, 6), 7 * S)
    assert live.restarts == [Restart(0, 100, 100, 0)]


def test_ranks_without_heartbeats_are_judged_by_their_hellos() -> None:
    live = Liveness()
    for t in range(0, 20, 2):  # an older shim: hellos every 2 s, no heartbeat, no iteration after the first
        live.take(_hello(0, 100, seq=t), t * S)
    live.take(_iter(0, 0, 100), S)
    assert live.assess(19 * S).silent == ()  # a hello 1 s ago
    assert [r for r, _, _ in live.assess(25 * S).silent] == [0]  # 7 s without a word


def test_the_pipeline_replays_a_stall_from_frames_alone() -> None:
    frames = _frames_of_a_stall()
    frames.append(RawFrame(16 * S, wire.encode(wire.Heartbeat(10_000, 1, 30, "backward layers.3", 5, state=OPEN))))
    pipeline = Pipeline(window=None)
    pipeline.feed(frames)
    [stall] = pipeline.liveness.stalls
    [holder] = stall.holders
    assert holder.rank == 1 and holder.silent_s >= 12 and stall.stalled_s >= 12
    assert (holder.task, stall.waiting) == ("backward layers.3", (("all-reduce bucket 0", (0,)),))
    assert pipeline.snapshot().liveness == pipeline.liveness.view


def test_many_ranks_are_said_in_groups_and_judged_quickly() -> None:
    live = Liveness()
    ranks = 4096
    for rank in range(ranks):
        live.take(_hello(rank, 1000 + rank), 0)
        live.take(_iter(rank, 0, 1), S)
    for t in range(2, 10):  # all but ranks 8-15 (one host) keep saying they wait in the same all-reduce
        for rank in range(ranks):
            if not 8 <= rank < 16:
                live.take(wire.Heartbeat(t, rank, 1, "all-reduce bucket 7", t * 1000, state=IN_COLLECTIVE), t * S)
            elif t == 2:
                live.take(wire.Heartbeat(t, rank, 1, "backward layers.3", 10, state=OPEN), t * S)
    started = time.process_time()
    view = live.assess(10 * S)
    spent = time.process_time() - started
    assert view.line() == ("ranks 8-15 hold the job: silent 8 s (last: backward layers.3) · "
                           "ranks 0-7, 16-4095 waiting in all-reduce bucket 7")
    [stall] = live.stalls
    assert [h.rank for h in stall.holders] == list(range(8, 16)) and stall.waiting == view.waiting
    assert spent < 1.0  # linear in the ranks: milliseconds; a quadratic look would take tens of seconds


def test_ranks_text_groups_runs() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2, 4, 5, 6, 7, 9]) == "ranks 0-2, 4-7, 9"
    assert LivenessView().line() == ""


def test_pid_alive_sees_this_process_and_not_an_exited_one_even_unreaped() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while pid_alive(child.pid):  # exits, then stays a zombie until waited for: gone all the same
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
    finally:
        child.wait()


def _here() -> str:
    import socket

    return socket.gethostname()


def test_the_screen_names_the_silent_rank_and_where_the_other_waits(tmp_path: Path) -> None:
    """Replayed to its end, a recording whose rank 1 went silent mid-run: the verdict's first line says so."""
    frames: list[RawFrame] = []
    recorder = Liveness()
    recorder.take = lambda frame, ns: frames.append(RawFrame(ns, wire.encode(frame)))  # type: ignore[method-assign]
    _run(recorder, until_s=15.0, stop_rank_1_at_s=3.0)
    path = tmp_path / "stall.dagtop"
    with RecordingWriter(path) as writer:
        for raw in frames:
            writer.append(raw)
    app = make_app(RecordingSource(path, speed=0), sampler=fake_telemetry, source_label="replay stall.dagtop")
    said: list[str] = []

    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(pilot, app)
            for _ in range(600):  # the panels redraw at most once a second
                said[:] = [str(app.query_one(Verdict).render().renderables[0])]  # type: ignore[attr-defined]
                if "silent" in said[0]:
                    break
                await pilot.pause(0.05)

    asyncio.run(main())
    assert said[0].startswith("rank 1 holds the job: silent 1"), said
    assert "(last: backward layers.3) · rank 0 waiting in all-reduce bucket 0" in said[0]


def test_ranks_with_no_task_open_are_said_to_be_after_their_last() -> None:
    view = LivenessView(stalled_s=40.0, waiting=((OpenTask("after optimizer.step", BETWEEN), (0, 1)),
                                                 (OpenTask("between iterations", BETWEEN), (2,)),
                                                 (OpenTask("loader next", OPEN), (3,))))
    assert view.line() == ("no iteration for 40 s · ranks 0-1 after optimizer.step · rank 2 between iterations · "
                           "rank 3 waiting in loader next")


def test_a_heartbeat_is_judged_by_its_state_not_by_its_task_name() -> None:
    """The task's name is shown as sent; whether a rank waits in a collective, works in a task or has none open is
    the heartbeat's state. Names that read like a collective or like ``after X`` decide nothing."""
    live = Liveness()
    _run(live, until_s=5.0)
    for t in range(5, 45):
        open_ms = (t - 5) * 1000 + 300
        live.take(wire.Heartbeat(2000 + t, 0, 50, "custom exchange", open_ms, state=IN_COLLECTIVE), t * S)
        live.take(wire.Heartbeat(3000 + t, 1, 50, "after the loss", open_ms, state=OPEN), t * S)
        live.take(wire.Heartbeat(4000 + t, 2, 50, "all-reduce bucket 3", open_ms, state=BETWEEN), t * S)
    view = live.assess(44 * S + S // 2)  # 39.3 s open at the last beat, 0.5 s before
    assert [(h.rank, h.task) for h in view.holders] == [(1, "after the loss"), (2, "all-reduce bucket 3")]
    assert view.line() == ("rank 1 holds the job: in after the loss for 40 s · "
                           "rank 2 holds the job: all-reduce bucket 3 for 40 s · rank 0 waiting in custom exchange")


def test_a_heartbeat_without_a_state_is_no_collective_and_is_said_as_sent() -> None:
    """An older rank's heartbeat (no ``state``), or a value this monitor does not know: nothing is read from the name,
    so no rank is taken to wait in a collective, and the task is said as it came."""
    live = Liveness()
    _run(live, until_s=5.0)
    for t in range(5, 45):
        live.take(wire.Heartbeat(2000 + t, 0, 50, "all-reduce bucket 0", (t - 5) * 1000), t * S)
        live.take(wire.Heartbeat(3000 + t, 1, 50, "loader next", (t - 5) * 1000, state=200), t * S)
    view = live.assess(44 * S + S // 2)
    assert view.stalled_s > 30 and view.holders == ()
    assert view.line() == "no iteration for 40 s · rank 0 all-reduce bucket 0 · rank 1 loader next"
    assert Holder(1, "forward layers.3", 4.0).describe() == "forward layers.3 for 4 s"
    assert Holder(1, OpenTask("forward layers.3", OPEN), 4.0).describe() == "in forward layers.3 for 4 s"


def test_the_state_travels_and_an_older_frame_decodes_as_unknown() -> None:
    beat = wire.Heartbeat(1, 0, 3, "all-reduce bucket 0", 5, 7, 9, state=IN_COLLECTIVE)
    assert wire.decode(wire.encode(beat)) == beat
    older = wire.encode(wire.Heartbeat(1, 0, 3, "after optimizer.step", 5, 7, 9))
    assert wire.decode(older).state == TaskState.UNKNOWN  # type: ignore[union-attr]
    assert b"\xa2st" not in older and b"\xa2st" in wire.encode(beat)  # left out when not said: an older rank's bytes
