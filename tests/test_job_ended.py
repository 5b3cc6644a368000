"""Once the job has ended, nothing on the live screen or in Prometheus says it still runs: the status line says when
it ended instead of a lag that grows, and the rate is 0 with ``dagtop_job_running`` 0 (issue #30)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from test_metrics import samples

from dagtop.demo.launch import free_endpoint, free_port

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

T = TypeVar("T")
DEADLINE_S = 120.0
"""How long to wait for anything to happen: generous, the machine is shared and may be slow."""

RANK = """
import os, sys, time
from instrument import wire
from instrument.publisher import Publisher
rank, stop = int(sys.argv[1]), sys.argv[2]
def hello(seq):
    return wire.Hello(seq, rank, 2, rank, "h", os.getpid(), "cpu", "t", "M", 1, "block", 1, time.perf_counter_ns())
publisher = Publisher(os.environ["DAGTOP_ENDPOINT"], rank, hello, on_error=lambda exc: print("error", exc))
it, deadline = 0, time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < deadline:
    now = time.perf_counter_ns()
    publisher.put_iteration(it, [("io", "load", "next", "main", now, now + 2_000_000, 0),
                                 ("compute", "forward", "net", "main", now + 2_000_000, now + 9_000_000, 0),
                                 ("compute", "update", "optimizer.step", "main", now + 9_000_000, now + 10_000_000, 0)])
    it += 1
    time.sleep(0.05)
publisher.close()
"""
"""A rank of a 2-rank job: an iteration every 50 ms until the stop file appears, then bye."""


Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _wait(what: str, get: Callable[[], T], ready: Callable[[T], bool]) -> T:
    """Poll ``get`` until ``ready`` holds for what it returns, up to :data:`DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    got = get()
    while not ready(got):
        assert time.monotonic() < deadline, f"{what} never happened; last: {got}"
        time.sleep(0.2)
        got = get()
    return got


def _scrape(port: int) -> Scrape:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return samples(r.read().decode())
    except OSError:
        return {}


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_after_the_job_ends_the_lag_stops_and_the_rate_is_zero(tmp_path: Path, size: tuple[int, int]) -> None:
    endpoint, port = free_endpoint(), free_port()
    socket_name, stop = f"dagtop-ended-{uuid.uuid4().hex[:8]}", tmp_path / "stop"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket_name, "-f", "/dev/null", *args], capture_output=True,
                              text=True).stdout

    command = "env -u COLUMNS -u LINES " + shlex.join(
        [sys.executable, "-m", "dagtop", "--bind", endpoint, "--metrics-port", f"127.0.0.1:{port}"])
    tmux("new-session", "-d", "-s", "dagtop", "-x", str(size[0]), "-y", str(size[1]), command)
    env = {**os.environ, "DAGTOP_ENDPOINT": endpoint, "DAGTOP_TELEMETRY": "0"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(stop)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for r in (0, 1)]
    try:
        def screen() -> str:
            return tmux("capture-pane", "-p", "-t", "dagtop")

        running = _wait("a scrape of the running job", lambda: _scrape(port),
                        lambda s: s.get(("dagtop_iterations_per_second", ()), 0) > 0)
        assert running[("dagtop_job_running", ())] == 1
        assert "job ended" not in _wait("the lag on screen", screen, lambda s: "lag " in s)
        stop.touch()
        for p in ranks:
            p.wait(DEADLINE_S)
        shown = _wait("the end on screen", screen, lambda s: "job ended" in s.partition("\n")[0])
        status = shown.splitlines()[0]
        assert re.search(r"job ended \d\d:\d\d:\d\d", status) and "lag" not in status, shown
        ended = _wait("a scrape after the end", lambda: _scrape(port),
                      lambda s: s.get(("dagtop_job_running", ()), 1) == 0)
        assert ended[("dagtop_iterations_per_second", ())] == 0
        rates = [v for (name, _), v in ended.items() if name == "dagtop_rank_iterations_per_second"]
        assert rates and all(v == 0 for v in rates)
        time.sleep(2.0)  # four of the status line's lag ticks: the line must not change any more
        assert screen().splitlines()[0] == status
    finally:
        stop.touch()
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.wait()
        tmux("send-keys", "-t", "dagtop", "q")
        time.sleep(0.5)
        tmux("kill-server")
