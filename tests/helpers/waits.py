"""How long tests wait for a condition. Generous on purpose: a wait ends as soon as its condition is met, so a long
deadline costs nothing on a fast machine and keeps a loaded 2-core runner from failing a test that would pass."""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT_S = 60.0
"""For something that takes milliseconds on an idle machine (a frame through a socket, Python or Textual
starting): a loaded CI runner is slow."""
JOB_WAIT_S = 240.0
"""For something that needs real torch ranks to train (their frames, a stall, a metric that follows them): a loaded
2-core machine runs two torch ranks slowly."""


def until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` has passed; whether it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.02)
    return True
