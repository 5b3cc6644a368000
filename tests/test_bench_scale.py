"""benchmarks/bench_scale.py's own parts: the frames it replays, and how it reads the screen."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_scale
from bench_scale import encode_job, shown_iteration

from dagtop.demo.launch import free_endpoint
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob
from instrument import wire


def test_each_rank_sends_its_hello_then_its_iterations_in_order() -> None:
    job = SyntheticJob(ranks=12, blocks=4)
    by_rank = encode_job(job, iterations=3)
    assert len(by_rank) == 12
    for r, frames in enumerate(by_rank):
        decoded = [wire.decode(f) for f in frames]
        assert [d.rank for d in decoded] == [r] * 4
        assert isinstance(decoded[0], wire.Hello) and decoded[0].host == f"node{r // 8}"
        assert [d.seq for d in decoded] == [0, 1, 2, 3]
        assert [d.iteration if isinstance(d, wire.IterationBatch) else None for d in decoded[1:]] == [0, 1, 2]


def test_the_replayed_frames_make_a_whole_job() -> None:
    job = SyntheticJob(ranks=12, blocks=4)
    pipeline = Pipeline(expected_ranks=12)
    by_rank = encode_job(job, iterations=3)
    for i in range(4):  # as the publishers send: every rank's hello, then iteration by iteration
        pipeline.feed([RawFrame(1, frames[i]) for frames in by_rank])
    pipeline.finish()
    snapshot = pipeline.snapshot()
    assert [a.iteration for a in snapshot.iterations] == [0, 1, 2]
    assert all(a.complete and len(a.ranks) == 12 for a in snapshot.iterations)
    assert snapshot.dropped == 0 and snapshot.rejected == 0


def test_the_shown_iteration_is_read_from_the_status_line() -> None:
    screen = " dagtop │ ranks 64/64 │ iteration 17 │ 1.0 it/s │ lag 0.87 s\n╭─ timeline · iteration 17 ·"
    assert shown_iteration(screen) == 17
    assert shown_iteration(" dagtop │ ranks 0/64 │ no iteration yet") is None
    assert shown_iteration("") is None


def test_shared_sockets_send_every_ranks_frames_over_one_socket() -> None:
    job = SyntheticJob(ranks=4, blocks=2)
    bench_scale._FRAMES[:] = encode_job(job, iterations=2)
    endpoint = free_endpoint()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(endpoint)
    go, late = threading.Event(), SimpleNamespace(value=0.0)
    go.set()
    try:
        time.sleep(0.3)  # the publisher's subscription, before its first iteration (a second after go)
        sender = threading.Thread(target=bench_scale.publish, args=([endpoint], [0, 1, 2, 3], 10.0, go, late, True))
        sender.start()
        iterations: list[tuple[int, int]] = []  # the hellos, sent at once, may come before the subscription
        deadline = time.monotonic() + 10
        while len(iterations) < 8 and time.monotonic() < deadline:
            if sub.poll(100) and isinstance(frame := wire.decode(sub.recv()), wire.IterationBatch):
                iterations.append((frame.rank, frame.iteration))
        sender.join(10)
    finally:
        sub.close(linger=0)
        bench_scale._FRAMES.clear()
    assert sorted(iterations) == [(r, i) for r in range(4) for i in range(2)]


class FakePane:
    """tmux for :func:`bench_scale.browse`: ← shows ``iteration 9 of 10``, → ``iteration 10``, each after
    ``polls`` captures of the line as it was (a screen that takes a while to draw); ``answers`` keys at most."""

    def __init__(self, polls: int, answers: int = 10**9) -> None:
        self.polls, self.answers = polls, answers
        self.line, self.pending, self.waited, self.keys = "dagtop │ iteration 10 │ 1.0 it/s", "", 0, []

    def __call__(self, *args: str, check: bool = True) -> SimpleNamespace:
        if args[0] == "send-keys":
            self.keys.append(args[-1])
            if len(self.keys) <= self.answers:
                back = args[-1] == "Left"
                self.pending = "dagtop  PAUSED  │ iteration " + ("9 of 10" if back else "10") + " │ 0.0 it/s"
                self.waited = 0
        elif args[0] == "capture-pane":
            self.waited += 1
            if self.pending and self.waited > self.polls:
                self.line, self.pending = self.pending, ""
        return SimpleNamespace(stdout=self.line + "\n")


def test_browsing_times_each_key_to_the_frame_that_answers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pane = FakePane(polls=3)
    monkeypatch.setattr(bench_scale, "tmux", pane)
    latencies = bench_scale.browse("s", 0.3)
    assert len(latencies) >= 2 and pane.keys[:2] == ["Left", "Right"]
    assert len(pane.keys) == len(latencies)  # the next key only once the last was answered
    assert all(0.015 <= t < 1.0 for t in latencies)  # three polls of 5 ms at least, each


def test_a_key_the_screen_never_answers_ends_browsing_with_inf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_scale, "tmux", FakePane(polls=0, answers=1))
    monkeypatch.setattr(bench_scale, "KEY_TIMEOUT_S", 0.2)
    latencies = bench_scale.browse("s", 5.0)
    assert len(latencies) == 2 and latencies[-1] == float("inf")


def test_sorting_live_waits_for_the_rank_table_titled_with_each_sort_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagtop.ui.widgets.rank_table import SORTS

    titles = ["slowest first" if key == "auto" else f"by {key}" for key in SORTS]
    pane = SimpleNamespace(keys=[], shown=0, captures=0)

    def tmux(*args: str, check: bool = True) -> SimpleNamespace:
        if args[0] == "send-keys":
            pane.keys.append(args[-1])
        elif args[0] == "capture-pane":
            pane.captures += 1
            if pane.captures % 2 == 0:  # the frame comes on the second look
                pane.shown = len(pane.keys)
        return SimpleNamespace(stdout=f"╭─ ranks ─ {titles[pane.shown % len(titles)]} · 1–20 of 64 ─╮\n")

    monkeypatch.setattr(bench_scale, "tmux", tmux)
    latencies = bench_scale.sort_live("s", 1.0)
    assert len(latencies) > len(titles) and set(pane.keys) == {"s"}  # round the whole cycle, back to the first
    assert len(pane.keys) == len(latencies) and all(t < 1.0 for t in latencies)
