"""The publisher thread sleeps until it has something to do: no polling while idle, and what is handed over goes
out at once, not at the next periodic duty."""

from __future__ import annotations

import time
from typing import Any

import pytest

from instrument import publisher as publisher_module
from instrument import wire
from instrument.publisher import Publisher


def _hello(seq: int) -> wire.Hello:
    return wire.Hello(seq, 0, 1, 0, "h", 1, "cpu", "t", "M", 1, "block", 1, time.perf_counter_ns())


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
        telemetry = wire.Telemetry(0, 0, "h", 0, now, wire.HostStats(1.0, 2, 3, 4), None)
        publisher.put_telemetry(telemetry)
        collector.wait_for(lambda frames: any(isinstance(f, wire.Telemetry) for f in frames), "the telemetry")
    finally:
        publisher.close()
    assert not publisher.alive
    collector.until_bye()


def test_hand_overs_after_close_are_harmless(endpoint: str) -> None:
    publisher = Publisher(endpoint, 0, _hello, on_error=lambda exc: None)
    publisher.close()
    for it in range(100_000):  # more than a pipe holds: nothing blocks, nothing raises
        publisher.put_iteration(it, [])
    assert not publisher.alive
