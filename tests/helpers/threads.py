"""The shim's own threads as anyone looking at the process sees them: by name, in ``threading.enumerate()``."""

from __future__ import annotations

import threading

from helpers.waits import WAIT_S, until

PUBLISHER = "dagtop-publisher"
TELEMETRY = "dagtop-telemetry"


def shim_threads() -> set[threading.Thread]:
    """The shim's threads alive now (another test's may still be ending: compare with a set taken before)."""
    return {t for t in threading.enumerate() if t.name in (PUBLISHER, TELEMETRY)}


def all_ended(threads: set[threading.Thread], timeout_s: float = WAIT_S) -> bool:
    """Whether every one of ``threads`` has ended within ``timeout_s``."""
    return until(lambda: not any(t.is_alive() for t in threads), timeout_s)
