"""Where frames come from: a live ZeroMQ socket or a recording, behind one small interface.

The recorder, the report, the live screen and replay all run the same pipeline on a
:class:`FrameSource`; only the source differs, so tests and screenshots need no sockets.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator

import zmq
from zmq.utils.monitor import recv_monitor_message

from dagtop.exits import Exit
from dagtop.io.auth import AuthError, MonitorAuth, monitor_auth
from dagtop.io.recording import RecordingReader
from dagtop.model.frames import RawFrame
from instrument.wire import DEFAULT_ENDPOINT, MAX_FRAME_BYTES

RCVHWM = 1000
"""Messages libzmq queues per connected rank before it stops reading that rank's connection (TCP pushes back and
the rank's XPUB counts what it cannot send): as many as the rank's own send queue, minutes of a rank's frames,
and with MAXMSGSIZE a bound on what one connection can make the monitor hold."""
PING_EVERY_MS = 1000
"""How often the monitor's end of each connection sends ZeroMQ's heartbeat (a ZMTP PING of a few bytes): not for
liveness (ranks say where they are in their frames; no timeout either, so a slow monitor never cuts a rank and
loses what it held) but to move the TCP window along. A monitor that stops reading long enough to fill its receive
buffer (stopped, paused, far behind) reopens its window, when it reads again, with one update that can be smaller
than the rank's next segment; that rank then sends nothing until its next zero-window probe, whose interval has
doubled all through the outage (~15 s after a 30 s one), and a receiver whose window is open says nothing more on
its own. Any segment from the monitor carries its whole open window: each rank is heard again within about this
long of the monitor reading again (tests/test_faults.py, the monitor stopped 30 s)."""
REFUSED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
"""Handshakes that --auth refused: a wrong key (AUTH), a rank without keys (PROTOCOL: it spoke no CURVE)."""

ANY_LOCAL_PORT = "tcp://127.0.0.1:*"
"""Bind a port ZeroMQ picks on 127.0.0.1 (the demo's default): :attr:`ZmqSource.endpoint` then names it."""


def listen_to_ranks(sock: zmq.Socket[bytes]) -> None:
    """Set up the side that ranks (or relays) connect to, before it binds: how much it holds per connection
    (:data:`RCVHWM`, ``MAXMSGSIZE``), no linger, and a ping on every connection (:data:`PING_EVERY_MS`)."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.HEARTBEAT_IVL, PING_EVERY_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 0)  # never cut a connection for silence: late is not lost


class BindError(Exception):
    """The SUB socket cannot bind its endpoint; the message is the one line to tell the user."""


class FrameSource(ABC):
    """A stream of raw frames, read in batches by one thread."""

    live: bool = False
    """True for a running job, False for a recording."""
    refused: int = 0
    """Connections refused by CURVE authentication so far (``--auth``): wrong keys or none."""

    @abstractmethod
    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        """Wait up to ``timeout_s`` for frames and return those available (at most ``max_frames``)."""

    @property
    @abstractmethod
    def finished(self) -> bool:
        """True once no frame will ever come again (a recording read to its end)."""

    def close(self) -> None:
        """Release the socket or file."""


class ZmqSource(FrameSource):
    """Binds a SUB socket that every rank's PUB connects to: the one place dagtop binds (live, record, demo).

    Messages over :data:`~instrument.wire.MAX_FRAME_BYTES` are refused by libzmq before they are read (it drops
    that connection; the rank reconnects). With ``auth`` (:class:`~dagtop.io.auth.MonitorAuth`) the socket is a
    CURVE server that lets in only ranks holding the rank key; :attr:`refused` counts the handshakes refused.

    Raises:
        BindError: the endpoint is in use, or not an address of this machine.
    """

    live = True

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 auth: MonitorAuth | None = None) -> None:
        self._own_context = auth is not None and context is None  # one ZAP handler per context: a context of its own
        self._context = zmq.Context() if self._own_context else (context or zmq.Context.instance())
        self._socket = self._context.socket(zmq.SUB)
        listen_to_ranks(self._socket)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._auth = auth
        self._events: zmq.Socket[bytes] | None = None
        if auth is not None:
            auth.serve(self._socket)
            self._events = self._socket.get_monitor_socket(REFUSED_EVENTS)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            why = str(exc) if exc.errno is None else zmq.strerror(exc.errno)  # pyzmq's own text repeats the address
            if exc.errno == errno.ENODEV:  # ZeroMQ took the host for a network interface's name and found none
                why = "no address or network interface of this machine has that name"
            hint = " (is another dagtop running? try --bind)" if exc.errno == zmq.EADDRINUSE else ""
            raise BindError(f"cannot bind {endpoint}: {why}{hint}") from exc
        self.endpoint = endpoint
        """Where the ranks publish: as asked, or the port ZeroMQ picked for a ``*`` or ``0`` one."""
        if endpoint.startswith("tcp://") and endpoint.rpartition(":")[2] in ("*", "0"):
            self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        ready = self._poller.poll(int(timeout_s * 1000))
        if self._events is not None:
            self._count_refused()
        if not ready:
            return []
        frames: list[RawFrame] = []
        while len(frames) < max_frames:
            try:
                payload = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            frames.append(RawFrame(time.perf_counter_ns(), payload))
        return frames

    @property
    def finished(self) -> bool:
        return False

    def _count_refused(self) -> None:
        assert self._events is not None
        while True:
            try:
                event = recv_monitor_message(self._events, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] & REFUSED_EVENTS:
                self.refused += 1

    def close(self) -> None:
        if self._events is not None:
            self._socket.disable_monitor()
            self._events.close(linger=0)
            self._events = None
        self._socket.close(linger=0)
        if self._auth is not None:
            self._auth.close()
        if self._own_context:
            self._context.term()
            self._own_context = False


class RecordingSource(FrameSource):
    """Plays a recording back, at its own pace times ``speed`` (0 means as fast as possible)."""

    def __init__(self, path: str | os.PathLike[str], speed: float = 0.0) -> None:
        self.reader = RecordingReader(path)
        self.speed = speed
        self._frames: Iterator[RawFrame] = iter(self.reader)
        self._pending: RawFrame | None = None
        self._done = False
        self._first_received: int | None = None
        self._started = 0.0

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        out: list[RawFrame] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < max_frames:
            frame = self._pending or next(self._frames, None)
            self._pending = None
            if frame is None:
                self._done = True
                break
            if self.speed > 0:
                if self._first_received is None:
                    self._first_received, self._started = frame.received_ns, time.monotonic()
                due = self._started + (frame.received_ns - self._first_received) / 1e9 / self.speed
                now = time.monotonic()
                if due > now:
                    if out or due > deadline:
                        self._pending = frame
                        if not out:
                            time.sleep(max(0.0, deadline - now))
                        break
                    time.sleep(due - now)
            out.append(frame)
        return out

    @property
    def finished(self) -> bool:
        return self._done and self._pending is None

    @property
    def truncated(self) -> bool:
        """True if the recording's tail was cut short (known once it has been read to the end)."""
        return self.reader.truncated


def bind_live(command: str, bind: str, auth_directory: str | None) -> ZmqSource | int:
    """The socket every rank publishes to, for ``dagtop COMMAND`` (CURVE with ``--auth DIR``); or the exit status
    after saying on stderr, in one line, why it cannot be bound."""
    try:
        return ZmqSource(bind, auth=monitor_auth(auth_directory))
    except AuthError as exc:
        print(f"{command}: --auth: {exc}", file=sys.stderr)
        return exc.code
    except BindError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return Exit.CANNOT_BIND
