"""The priority of the shim's own threads (the publisher's, the telemetry's): below the training thread's."""

from __future__ import annotations

import os
import threading

BACKGROUND_NICE: int | None = 19
"""The niceness the shim's own threads (publisher, telemetry) run at, on Linux where niceness is per thread: on a
busy core the training thread is then not preempted each time one of them wakes, and their work (a fraction of
a percent of the core) fills the gaps instead. Measured by benchmarks/bench_overhead.py, which runs the publisher
at the process's own priority too (None) for comparison."""


def run_in_the_background() -> None:
    """Lower the calling thread's CPU priority to :data:`BACKGROUND_NICE`; where that cannot be done, nothing.

    Linux keeps a niceness per thread (``setpriority`` on the thread's id); raising it needs no privilege.
    """
    if BACKGROUND_NICE is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: the thread runs as it is
        pass
