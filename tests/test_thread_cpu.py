"""The CPU time a CPU rank counts beside its training thread: another thread's work counts, the shim's threads'
does not."""

from __future__ import annotations

import threading
import time

from instrument.probe import OwnTime
from instrument.steps import ThreadCpuCount

WORK_NS = 200_000_000


def _spin(clock: list[int] | None = None) -> None:
    """Spin until this thread has had WORK_NS of CPU; then, as a shim thread does, keep its CPU time in ``clock``."""
    began = time.thread_time_ns()
    while time.thread_time_ns() - began < WORK_NS:
        pass
    if clock is not None:
        clock[0] = time.thread_time_ns()


class _ShimThread:
    def __init__(self) -> None:
        self.clock = [0]

    @property
    def cpu_ns(self) -> int:
        return self.clock[0]


def _beside(worker: threading.Thread, own: OwnTime) -> int:
    count = ThreadCpuCount(own)
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    spent = count.spent()
    assert spent.total_ns < WORK_NS / 2  # the training thread only waited
    return spent.others_ns


def test_another_threads_work_counts_beside_the_training_thread() -> None:
    assert _beside(threading.Thread(target=_spin), OwnTime()) >= WORK_NS


def test_the_shims_own_threads_are_counted_out() -> None:
    own, shim = OwnTime(), _ShimThread()
    own.threads.append(shim)
    assert _beside(threading.Thread(target=_spin, args=(shim.clock,)), own) < WORK_NS / 4


def test_the_count_starts_over_each_iteration() -> None:
    count = ThreadCpuCount(OwnTime())
    worker = threading.Thread(target=_spin)
    worker.start()
    worker.join(60)
    assert count.spent().others_ns >= WORK_NS
    assert count.spent().others_ns < WORK_NS / 4
