"""Plumbing shared by the GPU checks: an in-process monitor, a draining monitor process, medians, the CLI."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, when run from a checkout

from dagtop.io.sources import ZmqSource
from instrument import wire

DEV = torch.device("cuda", 0)


def say(*args: Any) -> None:
    print(*args, flush=True)


# ---------------------------------------------------------------------------------------------- plumbing


class Collector:
    """A monitor in a thread: keeps every raw frame (decoding is done after the run)."""

    def __init__(self, endpoint: str) -> None:
        self.frames: list[bytes] = []
        self._source = ZmqSource(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.frames.extend(f.payload for f in self._source.poll(0.02))

    def iterations(self) -> dict[tuple[int, int], list[wire.Event]]:
        self._stop.set()
        self._thread.join(5)
        self._source.close()
        out = {}
        for payload in self.frames:
            frame = wire.decode(payload)
            if isinstance(frame, wire.IterationBatch):
                out[(frame.rank, frame.iteration)] = list(frame.events)
        return out


@contextlib.contextmanager
def drain_monitor(endpoint: str):  # type: ignore[no-untyped-def]
    """A separate process that binds and drains, as a real monitor would: its CPU is not the rank's."""
    code = ("import zmq,sys;c=zmq.Context();s=c.socket(zmq.SUB);s.bind(sys.argv[1]);s.subscribe(b'');"
            "\nwhile True: s.recv()")
    proc = subprocess.Popen([sys.executable, "-c", code, endpoint])
    time.sleep(0.5)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def iqr(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def dagtop_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dagtop", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def report(path: Path) -> dict[str, Any]:
    done = dagtop_cli("report", str(path), "--json")
    if done.returncode != 0:
        raise RuntimeError(f"report failed: {done.stderr}")
    return json.loads(done.stdout)
