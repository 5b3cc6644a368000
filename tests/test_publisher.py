"""The publisher thread sleeps until it has something to do: no polling while idle, and what is handed over goes
out at once, not at the next periodic duty."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers.frames import hello
from helpers.threads import PUBLISHER, TELEMETRY, shim_threads
from helpers.waits import WAIT_S

import instrument
from instrument import publisher as publisher_module
from instrument import wire
from instrument.events import TaskState
from instrument.publisher import Publisher
from instrument.wire_fields import HostStats


def _hello(seq: int) -> wire.Hello:
    return hello(seq=seq, mono_ns=time.perf_counter_ns())


def test_an_idle_publisher_sleeps_and_a_hand_over_wakes_it(collector: Any, endpoint: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # No periodic duty within the test: whatever is sent after the first hellos went out because it was handed over.
    monkeypatch.setattr(publisher_module, "HELLO_EVERY_S", 3600.0)
    monkeypatch.setattr(publisher_module, "HELLO_EARLY_S", ())
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None)
    try:
        collector.joined()  # the subscription woke it: a hello
        woken = publisher.turns
        time.sleep(1.0)
        assert publisher.turns <= woken + 1  # polling every 20 ms, as it did, would be 50 turns
        now = time.perf_counter_ns()
        publisher.put_iteration(0, [("compute", "update", "optimizer.step", "main", now, now + 5, 0)])
        collector.wait_for(lambda frames: any(isinstance(f, wire.IterationBatch) for f in frames), "the iteration")
        telemetry = wire.Telemetry(0, 0, "h", 0, now, HostStats(1.0, 2, 3, 4), None)
        publisher.put_telemetry(telemetry)
        collector.wait_for(lambda frames: any(isinstance(f, wire.Telemetry) for f in frames), "the telemetry")
    finally:
        publisher.close()
    assert not publisher.alive
    collector.until_bye()


def test_the_first_iterations_wait_for_the_monitor_to_subscribe(collector: Any, endpoint: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A job's first iteration is often handed over before the TCP connection is up: a PUB socket would drop it.
    # The hold is bounded (1 s); a loaded machine took longer than that to subscribe once, so here it is generous.
    monkeypatch.setattr(publisher_module, "JOIN_GRACE_S", WAIT_S)
    now = time.perf_counter_ns()
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None)
    for it in range(3):
        publisher.put_iteration(it, [("compute", "update", "optimizer.step", "main", now, now + 5, 0)])
    publisher.close(timeout_s=WAIT_S)
    collector.until_bye()
    assert [f.iteration for f in collector.decoded() if isinstance(f, wire.IterationBatch)] == [0, 1, 2]


def test_without_a_monitor_a_closing_rank_waits_no_longer_than_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "JOIN_GRACE_S", 0.3)
    publisher = Publisher("tcp://127.0.0.1:9", 0, _hello, on_error=lambda exc: None)  # nothing listens there
    publisher.put_iteration(0, [])
    publisher.close(timeout_s=WAIT_S)
    assert not publisher.alive
    assert publisher.iterations == 1  # sent after the grace, to nobody: training lost nothing but that frame


def test_hand_overs_after_close_are_harmless(endpoint: str) -> None:
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None)
    publisher.close()
    for it in range(100_000):  # more than a pipe holds: nothing blocks, nothing raises
        publisher.put_iteration(it, [])
    assert not publisher.alive


def test_heartbeats_say_where_the_rank_is_while_nothing_else_is_handed_over(collector: Any, endpoint: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "HELLO_EVERY_S", 3600.0)
    monkeypatch.setattr(publisher_module, "HEARTBEAT_EVERY_S", 0.2)
    opened = time.perf_counter_ns() - 3_000_000_000  # open for 3 s already
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None,
                          where=lambda: (7, "all-reduce bucket 2", opened, TaskState.COLLECTIVE))
    try:
        collector.joined()
        collector.wait_for(lambda frames: sum(isinstance(f, wire.Heartbeat) for f in frames) >= 3,
                           "three heartbeats")
    finally:
        publisher.close()
    beats = [f for f in collector.decoded() if isinstance(f, wire.Heartbeat)]
    assert {(b.rank, b.iteration, b.task, b.state) for b in beats} == {(0, 7, "all-reduce bucket 2",
                                                                         TaskState.COLLECTIVE)}
    assert all(b.open_ms >= 3000 for b in beats)
    assert beats[-1].open_ms > beats[0].open_ms  # the clock runs: how long it has been open, not a constant
    collector.until_bye()


def test_no_heartbeats_without_a_where(collector: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "HEARTBEAT_EVERY_S", 0.05)
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None)
    try:
        collector.joined()
        collector.wait_for(lambda frames: sum(isinstance(f, wire.Hello) for f in frames) >= 3, "three hellos")
    finally:
        publisher.close()
    collector.until_bye()
    assert not any(isinstance(f, wire.Heartbeat) for f in collector.decoded())


class _Gate(torch.nn.Module):
    """Passes its input through; while ``closed`` is set, waits for ``opened`` first (a forward that hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed, self.opened = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.closed.is_set():
            self.opened.wait(WAIT_S)
        return x


def test_a_rank_stuck_in_its_loader_or_a_forward_says_so_in_its_heartbeats(
        collector: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "HEARTBEAT_EVERY_S", 0.1)
    torch.manual_seed(0)
    gate = _Gate()
    model = torch.nn.Sequential()
    model.add_module("stem", torch.nn.Linear(4, 4))
    model.add_module("body", torch.nn.Sequential(gate, torch.nn.Linear(4, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loading, loaded = threading.Event(), threading.Event()

    def batches() -> Any:
        for i in range(3):
            if i == 1:
                loading.set()
                loaded.wait(WAIT_S)
            yield torch.randn(2, 4)

    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()

    def heard(task: str, iteration: int) -> Callable[[list[wire.Frame]], bool]:
        return lambda frames: any(isinstance(f, wire.Heartbeat) and f.task == task and f.iteration == iteration
                                  and f.state == TaskState.OPEN for f in frames)

    def train() -> None:
        for i, x in enumerate(tracer.loader(batches())):
            if i == 2:
                gate.closed.set()
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        collector.wait_for(heard("loader next", 1), "a heartbeat in the loader's wait")
        loaded.set()
        collector.wait_for(heard("forward body", 2), "a heartbeat in the gated forward")
    finally:
        loaded.set()
        gate.opened.set()
        trainer.join(WAIT_S)
        tracer.close()
    collector.until_bye()


def test_dagtop_heartbeat_0_turns_heartbeats_off(collector: Any, endpoint: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "HEARTBEAT_EVERY_S", 0.1)
    monkeypatch.setenv("DAGTOP_HEARTBEAT", "0")
    model = torch.nn.Linear(2, 2)

    def heartbeats() -> list[wire.Heartbeat]:
        return [f for f in collector.decoded() if isinstance(f, wire.Heartbeat)]

    tracer = instrument.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), endpoint=endpoint)
    try:
        collector.joined()
        time.sleep(1.0)  # ten heartbeats' time
    finally:
        tracer.close()
    collector.wait_for(lambda frames: any(isinstance(f, wire.Bye) for f in frames), "the first tracer's bye")
    assert not heartbeats()
    monkeypatch.delenv("DAGTOP_HEARTBEAT")
    tracer = instrument.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), endpoint=endpoint)
    try:
        collector.wait_for(lambda frames: any(isinstance(f, wire.Heartbeat) for f in frames), "a heartbeat")
    finally:
        tracer.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="niceness per thread is Linux's")
def test_the_shims_threads_run_niced_and_the_training_thread_does_not(endpoint: str) -> None:
    """On a busy core a woken publisher or telemetry thread must not preempt training (bench_overhead.py)."""
    from instrument.telemetry import TelemetryThread

    mine = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread's own
    before = shim_threads()
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None)
    telemetry = TelemetryThread(lambda sample: None, rank=0, local_rank=1, host="h", cuda_index=None,
                                every_s=3600.0, first_after_s=3600.0)
    try:
        started = shim_threads() - before
        assert sorted(t.name for t in started) == [PUBLISHER, TELEMETRY]
        for thread in started:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline and (
                    thread.native_id is None or os.getpriority(os.PRIO_PROCESS, thread.native_id) != 19):
                time.sleep(0.01)
            assert thread.native_id is not None and os.getpriority(os.PRIO_PROCESS, thread.native_id) == 19
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    finally:
        publisher.close()
        telemetry.close()
