"""`dagtop relay`: a node's ranks publish to it, it forwards to the monitor, a monitor started again is reached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.frames import hello
from helpers.waits import WAIT_S

from dagtop.commands.cli import main
from dagtop.demo.launch import free_endpoint
from dagtop.io.recording import read_recording
from dagtop.io.relay import Relay
from dagtop.io.sources import BindError, ZmqSource
from instrument import wire
from instrument.publisher import Publisher
from tests.ranks import run_job


@pytest.fixture
def relay() -> Iterator[tuple[Relay, str]]:
    """A relay in a thread, bound to a free port, forwarding to a monitor endpoint nobody has bound yet."""
    monitor = free_endpoint()
    relay = Relay("tcp://127.0.0.1:*", monitor)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield relay, monitor
    finally:
        relay.stop()
        thread.join(5)
        relay.close()


def _ranks(endpoint: str, stop: threading.Event) -> list[threading.Thread]:
    def rank(r: int) -> None:
        def said(seq: int) -> wire.Hello:
            return hello(r, 2, seq, pid=os.getpid(), mono_ns=time.perf_counter_ns())

        publisher = Publisher(endpoint, r, said, on_error=lambda exc: None)
        it = 0
        while not stop.is_set():
            now = time.perf_counter_ns()
            publisher.put_iteration(it, [("compute", "update", "optimizer.step", "main", now, now + 5, 0)])
            it += 1
            time.sleep(0.02)
        publisher.close()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    return threads


def _until_both_ranks_say_hello_and_train(source: ZmqSource) -> None:
    hellos: set[int] = set()
    trained: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    while hellos != {0, 1} or trained != {0, 1}:
        assert time.monotonic() < deadline, f"hellos from {hellos}, iterations from {trained}"
        for raw in source.poll(0.2):
            frame = wire.decode(raw.payload)
            if isinstance(frame, wire.Hello):
                hellos.add(frame.rank)
            elif isinstance(frame, wire.IterationBatch):
                trained.add(frame.rank)


def _bind(endpoint: str) -> ZmqSource:
    """A monitor's socket on ``endpoint``, once the last one has let go of the port (libzmq closes it
    asynchronously)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return ZmqSource(endpoint)
        except BindError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_monitor_started_again_behind_the_relay_gets_every_rank_back(relay: tuple[Relay, str]) -> None:
    forwarder, monitor = relay
    stop = threading.Event()
    threads = _ranks(forwarder.endpoint, stop)
    try:
        for _ in range(2):  # the monitor, then the monitor started again on the same endpoint
            source = _bind(monitor)
            try:
                _until_both_ranks_say_hello_and_train(source)
            finally:
                source.close()
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert forwarder.counts.subscriptions >= 2 and forwarder.counts.forwarded > 0


def test_a_real_job_recorded_through_the_relay_command(tmp_path: Path) -> None:
    monitor = free_endpoint()
    relay_bind = free_endpoint()
    log = tmp_path / "relay.log"
    with open(log, "wb") as sink:
        relay = subprocess.Popen([sys.executable, "-m", "dagtop", "relay", "--bind", relay_bind, "--to", monitor,
                                  "--every", "0"], stdout=sink, stderr=subprocess.STDOUT)
    path = tmp_path / "run.dagtop"
    recorder = subprocess.Popen([sys.executable, "-m", "dagtop", "record", "--bind", monitor, "-o", str(path),
                                 "--ranks", "2", "--iterations", "4", "--timeout", "120"])
    try:
        deadline = time.monotonic() + WAIT_S
        while "a monitor subscribed" not in log.read_text():  # the recorder is listening: the job may start
            assert time.monotonic() < deadline and recorder.poll() is None, log.read_text()
            time.sleep(0.1)
        job = run_job("loops.py", "--steps", "30", endpoint=relay_bind)
        status = recorder.wait(WAIT_S)
        assert job.ok, job.log
    finally:
        for process in (relay, recorder):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        code = relay.wait(WAIT_S)
        recorder.wait(WAIT_S)
    assert status == 0
    frames = [wire.decode(f.payload) for f in read_recording(path)]
    per_rank = {r: {f.iteration for f in frames if isinstance(f, wire.IterationBatch) and f.rank == r} for r in (0, 1)}
    assert len(per_rank[0] & per_rank[1]) >= 4
    said = log.read_text()
    assert code == 0 and "frames forwarded" in said, said
    forwarded = int(said.rsplit("dagtop relay: ", 1)[1].split()[0])
    assert forwarded >= 8


def test_an_endpoint_it_cannot_bind_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["relay", "--bind", "tcp://203.0.113.7:5556", "--to", free_endpoint()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dagtop relay: cannot bind tcp://203.0.113.7:5556") and err.count("\n") == 1
