"""The demo's ranks die with the ``dagtop demo`` that started them, however it dies (SIGKILL, a closed terminal)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from dagtop.demo.launch import DemoJob
from dagtop.io.recording import read_recording
from instrument import wire

pytestmark = pytest.mark.slow

MARKER = "DAGTOP_TEST_DEMO"
"""Set on the ``dagtop demo`` under test; its ranks inherit it, which tells them from other demos on the machine."""
ORPHAN_DEADLINE_S = 30.0
"""Generous: a rank notices within a second and stops at the next iteration boundary, even on a loaded machine."""


def _marked(marker: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``MARKER=marker`` (zombies excluded: they hold no CPU)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
            continue
    return found


def _ranks(marker: str) -> list[psutil.Process]:
    ranks = []
    for p in _marked(marker):
        try:
            if "dagtop.demo.job" in p.cmdline():
                ranks.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ranks


def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


def _assert_all_gone(marker: str) -> None:
    """Within the deadline nothing of the demo is left: not its ranks, not the monitor."""
    deadline = time.monotonic() + ORPHAN_DEADLINE_S
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for p in _marked(marker):
        try:
            left.append(f"{p.pid} {' '.join(p.cmdline())}")
        except psutil.NoSuchProcess:
            continue  # gone between the look and the question
    assert not left, f"still running {ORPHAN_DEADLINE_S:g} s after their monitor died:\n" + "\n".join(left)


@pytest.fixture
def marker() -> Iterator[str]:
    """A fresh marker; whatever still carries it after the test is killed, so a failure leaves no orphans."""
    value = uuid.uuid4().hex
    yield value
    for p in _marked(value):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _iterations_recorded(path: Path) -> set[int]:
    if not path.exists():
        return set()
    ranks: dict[int, set[int]] = {}
    for raw in read_recording(path):
        try:
            frame = wire.decode(raw.payload)
        except wire.WireError:
            continue
        if isinstance(frame, wire.IterationBatch):
            ranks.setdefault(frame.iteration, set()).add(frame.rank)
    return {it for it, seen in ranks.items() if seen == {0, 1}}


def test_sigkill_of_a_recording_demo_takes_its_ranks_with_it(tmp_path: Path, marker: str) -> None:
    path = tmp_path / "run.dagtop"
    demo = subprocess.Popen([sys.executable, "-m", "dagtop", "demo", "--record", str(path),
                             "--iterations", "100000"], env={**os.environ, MARKER: marker},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Both ranks in their training loop: iterations from each are on disk.
        _until(lambda: len(_iterations_recorded(path)) >= 2, 120, "two complete iterations recorded")
        assert len(_ranks(marker)) == 2
        demo.send_signal(signal.SIGKILL)
        demo.wait(10)
        _assert_all_gone(marker)
    finally:
        demo.kill()
        demo.wait(10)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_killing_the_terminal_of_a_live_demo_takes_its_ranks_with_it(marker: str) -> None:
    socket = f"dagtop-test-{marker[:8]}"

    def tmux(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                              check=False)

    command = f"env -u COLUMNS -u LINES {MARKER}={marker} " + shlex.join(
        [sys.executable, "-m", "dagtop", "demo"])
    assert tmux("new-session", "-d", "-s", "demo", "-x", "120", "-y", "36", command).returncode == 0
    try:
        # A verdict on screen: both ranks are past their rendezvous and training.
        _until(lambda: "on the critical path" in tmux("capture-pane", "-p", "-t", "demo").stdout, 90,
               "a verdict on the live screen")
        assert len(_ranks(marker)) == 2
        assert tmux("kill-session", "-t", "demo").returncode == 0
        _assert_all_gone(marker)
    finally:
        tmux("kill-server")


def test_ranks_started_from_a_thread_that_ends_run_to_their_end(endpoint: str) -> None:
    """The monitor process is what the ranks watch, not the thread that spawned them (PR_SET_PDEATHSIG would
    fire when that thread ends: the live screen may start its job from a worker)."""
    job = DemoJob(endpoint, ranks=2, iterations=5)
    starter = threading.Thread(target=job.start)
    starter.start()
    starter.join()
    try:
        assert job.wait(240), job.log_tail()
        assert job.returncodes == [0, 0], job.log_tail()
    finally:
        job.stop()
