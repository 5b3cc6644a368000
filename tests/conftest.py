"""Shared test plumbing: skip CUDA tests without a GPU, free endpoints, and an in-process frame collector."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from dagtop.demo.launch import free_endpoint
from dagtop.recording import RawFrame
from dagtop.sources import ZmqSource


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
        self._thread.join(5)
        self._source.close()
        return self.frames


@pytest.fixture
def collector(endpoint: str) -> Iterator[Collector]:
    c = Collector(endpoint)
    yield c
    c.stop()


@pytest.fixture
def make_collector() -> Iterator[type[Collector]]:
    """The Collector class, for tests that start a monitor themselves (late, or going away)."""
    yield Collector
