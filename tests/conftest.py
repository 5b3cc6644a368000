"""Shared test plumbing: skip CUDA tests without a GPU, free endpoints, an in-process frame collector that waits
on conditions, no stopwatch in hypothesis, and a check that the run leaves no process behind."""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psutil
import pytest
from helpers.waits import WAIT_S
from hypothesis import settings

from dagtop.demo.launch import free_endpoint
from dagtop.io.sources import ZmqSource
from dagtop.model.frames import RawFrame
from instrument import wire

RUN_MARKER = "DAGTOP_TEST_RUN"
"""Set to a fresh id in the environment at session start: every process the tests start inherits it (demo ranks,
tmux servers and what runs in them), so the end of the run can find what was left behind, and only that."""
LEFTOVER_GRACE_S = 10.0
"""Processes that are on their way out (ranks at their last iteration, a tmux server closing) get this long."""


# Hypothesis fails an example that takes over 200 ms by default: a stopwatch, which a loaded runner trips.
settings.register_profile("dagtop", deadline=None)
settings.load_profile("dagtop")


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[RUN_MARKER] = uuid.uuid4().hex


def _leftovers(marker: str) -> list[psutil.Process]:
    """Live processes carrying this run's marker, other than pytest itself (zombies hold nothing: skipped)."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get(RUN_MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test that leaves a process running (an orphaned rank at full CPU) slows every test after it: find such
    processes, kill them, name them, and fail the run."""
    marker = os.environ.get(RUN_MARKER)
    if not marker:
        return
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := _leftovers(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return
    lines = []
    for p in left:
        try:
            lines.append(f"{p.pid} {' '.join(p.cmdline()) or p.name()}")
            p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    if not lines:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    heading = f"processes left behind by the tests, now killed: {len(lines)}"
    if reporter is not None:
        reporter.write("\n")  # the progress line is still open
        reporter.write_sep("=", heading, red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print(heading, *lines, sep="\n")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("cuda") for item in items):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(skip)


@pytest.fixture
def endpoint() -> str:
    """A free tcp endpoint on 127.0.0.1."""
    return free_endpoint()


class Collector:
    """A monitor in a thread: binds a SUB socket and keeps every frame (a SUB only subscribes while polled)."""

    def __init__(self, endpoint: str) -> None:
        self.frames: list[RawFrame] = []
        self._source = ZmqSource(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.frames.extend(self._source.poll(0.02))

    def stop(self) -> list[RawFrame]:
        self._stop.set()
        self._thread.join(30)
        self._source.close()
        return self.frames

    def decoded(self) -> list[wire.Frame]:
        """The frames so far, decoded; undecodable ones are left out."""
        frames = []
        for raw in list(self.frames):
            try:
                frames.append(wire.decode(raw.payload))
            except wire.WireError:
                continue
        return frames

    def wait_for(self, condition: Callable[[list[wire.Frame]], bool], what: str,
                 timeout_s: float = WAIT_S) -> None:
        """Poll until ``condition(self.decoded())`` holds; AssertionError naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not condition(self.decoded()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s:g} s ({len(self.frames)} frames)")
            time.sleep(0.02)

    def joined(self, timeout_s: float = WAIT_S) -> None:
        """Wait for a hello. A publisher sends one as soon as it sees this monitor subscribe, so from then on
        nothing it publishes is lost to ZeroMQ's slow joiner, however slowly the connection came up."""
        self.wait_for(lambda frames: any(isinstance(f, wire.Hello) for f in frames), "a hello", timeout_s)

    def until_bye(self, ranks: int = 1, timeout_s: float = WAIT_S) -> list[RawFrame]:
        """Wait for the bye of ``ranks`` ranks (each sends it after its last iteration), then stop; every frame."""
        self.wait_for(lambda frames: len({f.rank for f in frames if isinstance(f, wire.Bye)}) >= ranks,
                      f"a bye from {ranks} ranks", timeout_s)
        return self.stop()


@pytest.fixture
def collector(endpoint: str) -> Iterator[Collector]:
    c = Collector(endpoint)
    yield c
    c.stop()


@pytest.fixture
def make_collector() -> Iterator[type[Collector]]:
    """The Collector class, for tests that start a monitor themselves (late, or going away)."""
    yield Collector


@pytest.fixture(autouse=True)
def _gc_unfrozen() -> Iterator[None]:
    """A collector run in a test freezes what it folded (dagtop/ui/collector.py): thawed after each test, so no
    test inherits another's frozen objects."""
    yield
    gc.unfreeze()
