"""``dagtop relay``: one per node, between the node's ranks and the monitor (ZeroMQ XSUB → XPUB).

    dagtop relay --bind tcp://0.0.0.0:5556 --to tcp://MONITOR:5555     # on each node
    DAGTOP_ENDPOINT=tcp://127.0.0.1:5556 torchrun ...                    # the node's ranks publish to it

The monitor then holds one connection per node instead of one per rank. The relay binds an XSUB socket that the
node's ranks connect to (as they would to the monitor) and connects an XPUB socket to the monitor's SUB socket.
Frames go down unchanged and undecoded; subscriptions go up: every one, repeated ones included
(``XPUB_VERBOSE``), so that a monitor that starts, or starts again, reaches every rank's publisher, which
answers with its hello at once (and sends one every two seconds anyway).

It never blocks a rank: a frame the monitor cannot take now (no monitor, or one that does not keep up past the
high-water mark) is dropped and counted (``XPUB_NODROP`` makes the socket say so instead of dropping silently),
and the ranks' own sends are never held up by the relay (their sockets never block either). Frames over
:data:`~instrument.wire.MAX_FRAME_BYTES` are refused on the way in, as the monitor refuses them. With ``--auth
DIR`` it is a CURVE server to the ranks (holding the monitor's key pair, taking only the rank key) and a CURVE
client of the monitor (holding the rank key pair), as both sides expect.

Every ``--every`` seconds (and at exit) it prints one line: frames forwarded, dropped, and the subscriptions
passed up.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType

import zmq
from zmq.utils.monitor import recv_monitor_message

from dagtop.exits import Exit
from dagtop.io.auth import AuthError, MonitorAuth
from dagtop.io.sources import BindError, listen_to_ranks
from instrument.keys import curve_keys
from instrument.sockets import CONNECTION_EVENTS, SNDHWM, Link, reconnect_quickly

POLL_MS = 1000
"""The longest the relay sleeps with nothing to do: what bounds how late it sees a stop signal."""
FLUSH_S = 5.0
"""Stopped, the relay passes on what it has taken from the ranks for this long at most, until the monitor has
acknowledged it (:class:`~instrument.sockets.Link`): over a slow way to the monitor, seconds of frames wait in
ZeroMQ's queue and the kernel's (a job's last iterations and its byes among them)."""


@dataclass
class Counts:
    forwarded: int = 0
    dropped: int = 0
    """Frames the monitor could not take when they came (none connected, or its queue full)."""
    subscriptions: int = 0

    def line(self) -> str:
        return (f"dagtop relay: {self.forwarded} frames forwarded, {self.dropped} dropped (monitor absent or "
                f"behind), {self.subscriptions} subscriptions passed to the ranks")


class Relay:
    """The two sockets and the loop between them; :meth:`run` until :meth:`stop` (or a signal).

    Raises:
        BindError: ``bind`` cannot be bound.
        AuthError: ``auth`` given and the keys cannot be used.
    """

    def __init__(self, bind: str, to: str, auth: str | None = None) -> None:
        self.counts = Counts()
        self.say_subscriptions = False
        """Print a line each time a monitor subscribes (the command does; tests and embedders need not)."""
        self._stopping = False
        self._auth = MonitorAuth(auth) if auth is not None else None
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ranks = self._context.socket(zmq.XSUB)
        self.monitor = self._context.socket(zmq.XPUB)
        self._link = Link()
        """The connection to the monitor, for a stopped relay to wait on."""
        self._events: zmq.Socket[bytes] | None = None
        try:
            listen_to_ranks(self.ranks)
            self.monitor.setsockopt(zmq.LINGER, 0)
            self.monitor.setsockopt(zmq.SNDHWM, SNDHWM)
            self.monitor.setsockopt(zmq.XPUB_NODROP, 1)
            self.monitor.setsockopt(zmq.XPUB_VERBOSE, 1)
            if self._auth is not None:
                self._auth.serve(self.ranks)
                public, secret, server = curve_keys(auth or "")
                self.monitor.curve_publickey, self.monitor.curve_secretkey = public, secret
                self.monitor.curve_serverkey = server
            try:
                self.ranks.bind(bind)
            except zmq.ZMQError as exc:
                raise BindError(f"cannot bind {bind}: {exc.strerror}") from exc
            reconnect_quickly(self.monitor)  # as the ranks do: back within seconds of an outage of the monitor
            self._events = self.monitor.get_monitor_socket(CONNECTION_EVENTS,
                                                           addr=f"inproc://dagtop-relay-events-{id(self)}")
            self.monitor.connect(to)
        except BaseException:
            self.close()
            raise
        self.endpoint = str(self.ranks.getsockopt_string(zmq.LAST_ENDPOINT))
        """Where the ranks connect (the port, when ``bind`` asked for any)."""

    def run(self, every_s: float = 0.0) -> None:
        """Forward until :meth:`stop`, then what has come in meanwhile; print :class:`Counts` every ``every_s``
        seconds (0: only at the end)."""
        poller = zmq.Poller()
        poller.register(self.ranks, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        last_said = time.monotonic()
        while not self._stopping:
            ready = dict(poller.poll(POLL_MS))
            if self.monitor in ready:
                self._subscriptions()
            if self.ranks in ready:
                self._frames()
            if every_s and time.monotonic() - last_said >= every_s:
                print(self.counts.line(), file=sys.stderr, flush=True)
                last_said = time.monotonic()
        self._frames()

    def stop(self) -> None:
        self._stopping = True

    def close(self, flush_s: float = 0.0) -> None:
        """Close both sockets, first letting what the relay took reach the monitor for ``flush_s`` at most."""
        self.ranks.close(linger=0)
        until = time.monotonic() + flush_s
        events = self._events
        if events is not None:
            self._link.settle(lambda: self._read_events(events), until)
            self.monitor.disable_monitor()
            events.close(linger=0)
        self.monitor.close(linger=max(0, int((until - time.monotonic()) * 1000)))
        if self._auth is not None:
            self._auth.close()
        self._context.term()

    def _frames(self, batch: int = 1000) -> None:
        """Pass down what the ranks sent, without waiting: at most ``batch`` frames, then look up again."""
        for _ in range(batch):
            try:
                frame = self.ranks.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self.monitor.send(frame, zmq.NOBLOCK, copy=False)
                self.counts.forwarded += 1
            except zmq.Again:
                self.counts.dropped += 1

    def _read_events(self, events: zmq.Socket[bytes]) -> None:
        """Bring :attr:`_link` up to date with the connection's events so far."""
        while True:
            try:
                self._link.seen(recv_monitor_message(events, zmq.NOBLOCK))
            except zmq.Again:
                return

    def _subscriptions(self) -> None:
        """Pass up what the monitor subscribed to (every time: a restarted monitor makes the ranks say hello)."""
        while True:
            try:
                message = self.monitor.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.ranks.send(message)
            if message[:1] == b"\x01":
                self.counts.subscriptions += 1
                if self.say_subscriptions:
                    print("dagtop relay: a monitor subscribed; the ranks are asked for their hellos",
                          file=sys.stderr, flush=True)


def run_relay(args: argparse.Namespace) -> int:
    """``dagtop relay``: forward until SIGINT or SIGTERM; exit 0, or 2 with one line when it cannot start."""
    try:
        relay = Relay(args.bind, args.to, auth=args.auth)
    except (BindError, AuthError, RuntimeError) as exc:
        print(f"dagtop relay: {exc}", file=sys.stderr)
        return exc.code if isinstance(exc, AuthError) else Exit.CANNOT_BIND

    def stop(signum: int, frame: FrameType | None) -> None:
        relay.stop()

    relay.say_subscriptions = True
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"dagtop relay: ranks publish to {relay.endpoint}; forwarding to {args.to}", file=sys.stderr, flush=True)
    try:
        relay.run(every_s=args.every)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        print(relay.counts.line(), file=sys.stderr, flush=True)
        relay.close(FLUSH_S)
    return Exit.OK
