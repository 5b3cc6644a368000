"""How a connecting side (a rank's publisher, a relay) sets up its ZeroMQ socket to the monitor: how many frames
it holds for it, and how soon it comes back after an outage. The wire format itself is instrument/wire.py."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

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


CONNECTION_EVENTS: Final = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
"""The socket-monitor events :class:`Link` follows for the connection it holds."""
HANDSHAKE_FAILED: Final = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | \
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
"""Socket events that say the other end refused ZeroMQ's handshake (CURVE keys it does not take)."""
ATTEMPT_EVENTS: Final = (zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                         | HANDSHAKE_FAILED)
"""...and for the attempts to make one, up to the end of ZeroMQ's handshake over it (:meth:`Link.connecting`)."""
SETTLE_POLL_S: Final = 0.01


class Link:
    """The TCP connection a connecting socket holds to the monitor, followed from its socket-monitor events
    (:data:`CONNECTION_EVENTS`, whose value is the connection's file descriptor), so that a closing side can wait for
    the monitor to have what it sent.

    ZeroMQ's linger only waits for its own queue to reach the kernel. Closing the socket then leaves the kernel to
    send the rest, but the monitor's end pings every connection (dagtop.io.sources ``PING_EVERY_MS``), and data that
    arrives on a socket its process has closed makes the kernel reset the connection and drop what it still held
    (``TcpExtTCPAbortOnData``): over a 5 Mbit/s link, a relay stopped after its job lost the last 39 of 300 iterations
    and the ranks' byes that way."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.ready_at: float | None = None
        """When (``time.monotonic()``) ZeroMQ's handshake over the latest connection ended; None before the
        first."""
        self._attempt_at: float | None = None
        """When the connection attempt under way began (None: none is)."""
        self._unanswered = False
        """The latest attempt was given up unanswered (``CONNECT_TIMEOUT_MS``), not refused."""
        self._handshaken = False
        """ZeroMQ's handshake over the connection held ended."""

    def seen(self, event: Mapping[str, Any]) -> None:
        """Follow one socket-monitor event (others are ignored)."""
        kind, value, now = int(event["event"]), int(event["value"]), time.monotonic()
        if kind == zmq.EVENT_CONNECTED:
            self.fd, self._attempt_at, self._unanswered, self._handshaken = value, None, False, False
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.ready_at, self._handshaken = now, True
        elif kind & HANDSHAKE_FAILED:
            self._handshaken = True  # over, and refused: nothing on its way
        elif kind & (zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED) and value == self.fd:
            self.fd = None
        elif kind == zmq.EVENT_CONNECT_DELAYED:
            self._attempt_at = now
        elif kind == zmq.EVENT_CONNECT_RETRIED:
            # A port nobody listens on answers at once (refused); an attempt given up after CONNECT_TIMEOUT_MS had
            # no answer: its SYN or the reply was lost, and the next one may well get through.
            began, self._attempt_at = self._attempt_at, None
            self._unanswered = began is not None and now - began >= CONNECT_TIMEOUT_MS / 2000

    def connecting(self) -> bool:
        """Whether a connection is on its way (follows :data:`ATTEMPT_EVENTS`): an attempt under way, or the last
        one lost on the way rather than refused, or a connection made whose handshake has not ended (over a lossy
        link its messages wait for TCP to send them again)."""
        if self.fd is not None:
            return not self._handshaken
        return self._attempt_at is not None or self._unanswered

    def unacknowledged(self) -> int | None:
        """Bytes the kernel holds for the connection that the monitor has not acknowledged (Linux's ``SIOCOUTQ``);
        None with no connection, or where the kernel cannot say."""
        if self.fd is None:
            return None
        try:
            import fcntl  # Unix only
            import termios

            held = fcntl.ioctl(self.fd, termios.TIOCOUTQ, b"\0\0\0\0")
        except (ImportError, OSError, AttributeError):
            return None
        return int(struct.unpack("i", held)[0])

    def settle(self, read_events: Callable[[], None], until: float) -> None:
        """Wait, until ``until`` (``time.monotonic()``) at most, for the kernel to hold nothing unacknowledged on the
        connection at two looks :data:`SETTLE_POLL_S` apart (between them ZeroMQ hands over what it still queued);
        ``read_events`` first brings :attr:`fd` up to date."""
        empty = 0
        while time.monotonic() < until:
            read_events()
            held = self.unacknowledged()
            if held is None:
                return
            empty = empty + 1 if held == 0 else 0
            if empty >= 2:
                return
            time.sleep(SETTLE_POLL_S)
