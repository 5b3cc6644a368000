"""How a connecting side (a rank's publisher, a relay) sets up its ZeroMQ socket to the monitor: how many frames
it holds for it, and how soon it comes back after an outage. The wire format itself is instrument/wire.py."""

from __future__ import annotations

from typing import Final

import zmq

SNDHWM: Final = 1000
"""Frames a connecting side (a rank, a relay) holds for the monitor in ZeroMQ's queue; past it, frames are dropped
and counted, never waited for."""
RECONNECT_IVL_MS: Final = 250
RECONNECT_IVL_MAX_MS: Final = 2000
"""ZeroMQ's wait before trying the monitor again, doubling up to this while it stays away: a monitor back after
an outage sees every rank again within a few seconds."""
CONNECT_TIMEOUT_MS: Final = 1000
"""A connection attempt that has not been answered in this long is given up and tried again (a port whose packets
are dropped would otherwise wait on TCP's own SYN back-off: 1, 2, 4, … s)."""


def reconnect_quickly(sock: zmq.Socket[bytes]) -> None:
    """Make a connecting socket (a rank's, a relay's) come back within a few seconds of an outage of the monitor or
    of the way to it (:data:`RECONNECT_IVL_MAX_MS`, :data:`CONNECT_TIMEOUT_MS`). Frames queued meanwhile stay queued
    (up to :data:`SNDHWM`); a connection TCP itself gives up on loses what it had in flight, counted by the monitor
    from the gap in sequence numbers.

    No ``TCP_MAXRT`` (``TCP_USER_TIMEOUT``): cutting a connection whose data waits unacknowledged would bring the
    ranks back within 2 s of a port that dropped every packet for 30 s (without it, TCP's retransmission back-off:
    24-26 s, frames past the high-water mark dropped and counted), but late is not lost: on this project's 2-core
    VM (benchmarks/faults.py, one run each) a 10 s cut lost 93-349 iteration frames on a link dropping 20 % of
    packets, and 87-531 with the monitor stopped 30 s (a stopped reader's zero window counts as unacknowledged),
    where without it both lost none."""
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
