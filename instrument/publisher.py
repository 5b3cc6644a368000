"""The publisher: one daemon thread that owns the ZeroMQ socket; the training thread only enqueues."""

from __future__ import annotations

import collections
import dataclasses
import os
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Final

import zmq
from zmq.utils.monitor import recv_monitor_message

from instrument import settings, sockets, wire
from instrument.background import run_in_the_background
from instrument.events import RawEvent
from instrument.keys import curve_keys
from instrument.spans import fill_spans
from instrument.teardown import GATE_TIMEOUT_S, Gate, GpuResolver
from instrument.wire_fields import MAX_NAME_CHARS, Bucket

QUEUE_FRAMES: Final = 1024
"""Iterations waiting for the publisher thread; past this the training thread drops, never waits."""

SNDBUF_BYTES: Final = 16 * 1024
"""The kernel's send buffer for a rank's connection (Linux doubles it: ~50 iteration frames of a small model). Left
to itself that buffer grows to megabytes when the link is slow or the monitor stopped, and every frame in it must
go before a fresh one; kept small, the frames wait in ZeroMQ's queue (:data:`~instrument.sockets.SNDHWM`) instead,
which counts what it cannot hold. One rank's frames need far less than it carries. (A rank heard ~15 s late after
a monitor stopped 30 s was not this buffer but TCP's zero-window probe, with this buffer too: the monitor's ping,
dagtop's ``PING_EVERY_MS``, ends that wait.)"""
GPU_POLL_S: Final = 0.02
"""While an iteration's CUDA events have not run yet, how often the publisher thread looks again. Otherwise it
sleeps until something is enqueued, a monitor subscribes, or a hello or calibration is due."""

HELLO_EVERY_S: Final = 2.0
"""A monitor started after the job, or a hello lost to ZeroMQ's slow joiner, must not leave the monitor blind."""

HELLO_EARLY_S: Final = (0.2, 0.7)
"""Extra hellos soon after start, when the first one most likely went nowhere (connection not up yet)."""

JOIN_GRACE_S: Final = 1.0
"""Until a monitor has subscribed, and for at most this long after start, iterations wait in the queue: a PUB
socket drops what it sends before the subscription has arrived (ZeroMQ's slow joiner), and the first iterations
of a job, or of a rank torchrun has just restarted, are the ones that would go. With no monitor there (its port
refuses the connection), nothing is held longer, and a closing rank waits for it no longer either."""
JOIN_CONNECTING_S: Final = 8.0
"""While the connection to the monitor is on its way rather than refused (an attempt lost on a lossy link is given
up after ``sockets.CONNECT_TIMEOUT_MS`` and made again; a handshake whose messages TCP has to send again), the hold
lasts until the subscription, JOIN_GRACE_S after ZeroMQ's handshake, and this long after start at most; never past
half the queue, so that it never makes the training thread drop an iteration. Over a link losing a fifth of its
packets, one rank of a 2-rank job lost its first 42-105 iterations in 4 of 4 runs with the hold of JOIN_GRACE_S
alone."""

HEARTBEAT_EVERY_S: Final = 1.0
"""How often a rank says where it is (``heartbeat``): the monitor calls a rank silent after a few missed ones."""


def _close_all(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class Publisher:
    """Encodes and sends a rank's frames from a background thread, counting what it drops.

    Args:
        endpoint: where the monitor's SUB socket is bound; this side connects.
        hello: builds the rank's hello (called on the publisher thread, with the next seq).
        on_error: called once, on the publisher thread, if the thread itself fails.
        resolver: resolves CUDA events; None on CPU.
        where: the rank's iteration under way, its open task, since when (``perf_counter_ns``) and what it is (an
            ``instrument.events.TaskState``); called on the publisher thread about every second for a heartbeat.
            None: no heartbeats.
    """

    def __init__(
        self,
        endpoint: str,
        rank: int,
        hello: Callable[[int], wire.Hello],
        on_error: Callable[[BaseException], None],
        resolver: GpuResolver | None = None,
        where: Callable[[], tuple[int, str, int, int]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.rank = rank
        self._hello = hello
        self._on_error = on_error
        self._resolver: Gate | None = Gate(resolver) if resolver is not None else None
        self._where = where
        self._queue: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self.dropped_queue = 0
        """Frames the training thread could not enqueue (queue full); written by that thread only."""
        self.dropped_send = 0
        """Frames the socket refused (zmq.Again: the monitor is not keeping up); written by this thread only."""
        self.seq = 0
        self.sender = secrets.randbits(31) or 1
        """This publisher's mark on all its frames (``sender``): which process of a rank sent a frame."""
        self.iterations = 0
        self._auth = ""
        self.refused = 0
        """Handshakes the monitor refused (``--auth`` and a rank without the key, or with another)."""
        self._buckets: wire.Buckets | None = None
        """The last bucket map (seq and sender filled in as it is sent), sent again after every hello."""
        self._telemetry: collections.deque[wire.Telemetry] = collections.deque(maxlen=1)
        """The newest telemetry sample not sent yet: one slot, a newer sample replaces it (state, not events)."""
        self._stop = threading.Event()
        self._flush_until = 0.0
        """When a closing rank stops waiting for the monitor to have what it sent (``close``'s deadline)."""
        self._link = sockets.Link()
        self._wake_r, self._wake_w = os.pipe()
        """Any thread that hands something over writes a byte here; the publisher thread polls it with its sockets."""
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        # Closed only once nothing can write to them: a descriptor closed under a late hand-over could be reused.
        weakref.finalize(self, _close_all, self._wake_r, self._wake_w)
        self._woken = False
        """A byte is on its way: the next hand-over skips the write (one syscall an iteration at most)."""
        self.turns = 0
        """Times the publisher thread woke up: idle, a few a second (hellos), not a poll every few ms."""
        self.cpu_ns = 0
        """The publisher thread's CPU time as of the end of its last turn (``time.thread_time_ns``), which the
        process's CPU time beside the training thread is counted without."""
        self._thread = threading.Thread(target=self._run, name="dagtop-publisher", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.dropped_queue + self.dropped_send

    # ------------------------------------------------------------------ training thread

    def put_iteration(self, iteration: int, events: list[RawEvent], cpu: wire.ThreadCpu | None = None) -> None:
        """Hand one iteration's events (and the training thread's CPU times in it, on a CPU rank) over; never
        blocks, drops (and counts) when the queue is full."""
        if len(self._queue) >= QUEUE_FRAMES:
            self.dropped_queue += 1
            return
        self._queue.append(("iter", (iteration, cpu), events))
        self._wake()

    def put_buckets(self, buckets: list[Bucket], parameter_bytes: tuple[tuple[int, ...], ...] = (),
                    copy_ns: int = 0, add_ns: int = 0) -> None:
        """The final bucket map (its parameters' bytes and the times of passes over the gradients, where known);
        sent now and again with every hello."""
        frame = wire.Buckets(0, self.rank, tuple(buckets), 0, parameter_bytes, copy_ns, add_ns)
        self._queue.append(("buckets", frame, None))
        self._wake()

    def _wake(self) -> None:
        """Wake the publisher thread; never blocks (a full pipe already holds a wake-up)."""
        if self._woken:
            return
        self._woken = True
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # full, or closed by a publisher thread that has already stopped
            pass

    # ------------------------------------------------------------------ telemetry thread

    def put_telemetry(self, sample: wire.Telemetry) -> None:
        """The rank's latest telemetry (any seq); sent on the next turn of the publisher thread."""
        self._telemetry.append(sample)
        self._wake()

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued, say bye, and stop; waits ``timeout_s`` at most for that, then (the thread still
        running) up to :data:`~instrument.teardown.GATE_TIMEOUT_S` for a call into torch under way to end
        (:class:`~instrument.teardown.Gate`)."""
        self._flush_until = time.monotonic() + timeout_s
        self._stop.set()
        self._woken = False  # whatever another thread was doing, this wake-up must reach the publisher thread
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self._resolver is not None:
                self._resolver.shut(GATE_TIMEOUT_S)  # late: out of torch before the interpreter may finalize

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ publisher thread

    def _run(self) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = context.socket(zmq.XPUB)
        events: zmq.Socket[bytes] | None = None
        said_bye = False
        try:
            run_in_the_background()
            if self._resolver is not None:
                self._resolver.enter_thread()
            # XPUB, unlike PUB, says zmq.Again at the high-water mark instead of dropping silently, so drops
            # are counted; and it tells us when a monitor subscribes, so the hello goes out at once.
            sock.setsockopt(zmq.XPUB_NODROP, 1)
            sock.setsockopt(zmq.SNDHWM, sockets.SNDHWM)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDBUF, SNDBUF_BYTES)
            sockets.reconnect_quickly(sock)
            auth = self._auth = settings.read().auth
            if auth:
                sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve_keys(auth)
            # Handshake failures are the only way a rank learns that the monitor refuses it (one warning); the
            # connection's own events say which TCP connection a closing rank waits on.
            monitor = events = sock.get_monitor_socket(sockets.CONNECTION_EVENTS | sockets.ATTEMPT_EVENTS,
                                                       addr=f"inproc://dagtop-publisher-events-{id(self)}")
            sock.connect(self.endpoint)
            self._loop(sock, events)
            said_bye = True
            # The socket stays open until the monitor has what was sent, or close's deadline (sockets.Link).
            self._link.settle(lambda: self._read_events(monitor), self._flush_until)
        except BaseException as exc:  # noqa: BLE001 - the thread must never die silently nor raise into training
            self._on_error(exc)
        finally:
            # What ZeroMQ still queues (a slow link, behind a send buffer kept small) goes on until close's deadline:
            # without it, and without the wait above, a rank closing over a 5 Mbit/s link lost 251 of its last 300
            # iterations and its bye.
            flush_s = self._flush_until - time.monotonic() if said_bye else 0.0
            if events is not None:
                sock.disable_monitor()
                events.close(linger=0)
            sock.close(linger=max(0, int(flush_s * 1000)))
            context.term()
            self._woken = True  # hand-overs from now on write nothing

    def _send(self, sock: zmq.Socket[bytes], payload: bytes) -> None:
        self.seq += 1
        if len(payload) > wire.MAX_FRAME_BYTES:  # the monitor would drop the connection: drop the frame instead
            self.dropped_send += 1
            return
        try:
            sock.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped_send += 1

    def _send_hello(self, sock: zmq.Socket[bytes]) -> None:
        self._send(sock, wire.encode(dataclasses.replace(self._hello(self.seq), sender=self.sender)))
        if self._buckets is not None:
            self._send_buckets(sock)

    def _send_buckets(self, sock: zmq.Socket[bytes]) -> None:
        assert self._buckets is not None
        self._send(sock, wire.encode(dataclasses.replace(self._buckets, seq=self.seq, sender=self.sender)))

    def _send_heartbeat(self, sock: zmq.Socket[bytes]) -> None:
        assert self._where is not None
        iteration, task, since_ns, state = self._where()
        open_ms = max(0, (time.perf_counter_ns() - since_ns) // 1_000_000)
        self._send(sock, wire.encode(wire.Heartbeat(self.seq, self.rank, iteration, task[: MAX_NAME_CHARS],
                                                    open_ms, time.perf_counter_ns(), self.sender, state)))

    def _read_events(self, events: zmq.Socket[bytes]) -> None:
        """Follow the connection (:attr:`_link`) and warn once if the monitor refused this rank's handshake;
        training is not affected either way."""
        while True:
            try:
                event = recv_monitor_message(events, zmq.NOBLOCK)
            except zmq.Again:
                return
            self._link.seen(event)
            if not int(event["event"]) & sockets.HANDSHAKE_FAILED:
                continue
            if not self.refused:
                if not self._auth:
                    why = f"it takes only ranks with keys: set {settings.AUTH}=DIR (`dagtop keygen DIR`)"
                elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    why = f"it does not take the rank key in {settings.AUTH}={self._auth}"
                else:
                    why = (f"the handshake failed: the monitor.key in {settings.AUTH}={self._auth} is not that monitor's, "
                           "or it takes no keys (dagtop --auth DIR)")
                warnings.warn(f"dagtop: the monitor at {self.endpoint} refused rank {self.rank}: {why}; "
                              "training goes on, unseen by that monitor", RuntimeWarning, stacklevel=1)
            self.refused += 1

    def _loop(self, sock: zmq.Socket[bytes], events: zmq.Socket[bytes] | None = None) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)  # a monitor subscribing
        poller.register(self._wake_r, zmq.POLLIN)  # something handed over
        if events is not None:
            poller.register(events, zmq.POLLIN)  # a handshake refused
        started = time.monotonic()
        early = [started + s for s in HELLO_EARLY_S]
        self._send_hello(sock)
        next_hello = started + HELLO_EVERY_S
        next_calibration = started
        next_heartbeat = started + HEARTBEAT_EVERY_S if self._where is not None else float("inf")
        joined = False
        # What the last poll found readable (None on the first turn: everything). A turn reads only where something
        # waits: a look at an empty socket costs a call into libzmq and a raised zmq.Again, two of them a turn, and a
        # turn comes with every iteration handed over.
        ready: dict[Any, int] | None = None
        while True:
            self.turns += 1
            # Cleared before the queue is read: a hand-over from now on writes a byte, so none is missed.
            self._woken = False
            if ready is None or self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            stopping = self._stop.is_set()
            now = time.monotonic()
            subscribed = (ready is None or sock in ready) and self._subscribed(sock)
            joined = joined or subscribed
            if events is not None and (ready is None or events in ready):
                self._read_events(events)  # the connection's state, which the hold depends on
            hold_until = self._hold_until(started, stopping)
            holding = not joined and now < hold_until and 0 < len(self._queue) < QUEUE_FRAMES // 2
            if subscribed or (early and now >= early[0]) or now >= next_hello:
                while early and now >= early[0]:
                    early.pop(0)
                self._send_hello(sock)
                next_hello = now + HELLO_EVERY_S
            if self._resolver is not None and now >= next_calibration:
                self._resolver.calibrate()
                next_calibration = now + 1.0
            if now >= next_heartbeat:
                self._send_heartbeat(sock)
                next_heartbeat = now + HEARTBEAT_EVERY_S
            waiting_on_gpu = not holding and self._drain(sock, stopping)
            if self._telemetry:
                sample = self._telemetry.popleft()
                self._send(sock, wire.encode(dataclasses.replace(sample, seq=self.seq, sender=self.sender)))
            if stopping and not holding:
                self._send(sock, wire.encode(wire.Bye(self.seq, self.rank, self.iterations, self.dropped,
                                                      self.dropped_queue, self.sender)))
                return
            due = min([next_hello, next_heartbeat, *early[:1], *([next_calibration] if self._resolver is not None else []),
                       *([hold_until] if holding else [])])
            sleep_s = due - time.monotonic()
            if waiting_on_gpu:
                sleep_s = min(sleep_s, GPU_POLL_S)
            self.cpu_ns = time.thread_time_ns()
            ready = dict(poller.poll(max(0, int(sleep_s * 1000) + 1)))

    def _hold_until(self, started: float, stopping: bool) -> float:
        """Until when iterations wait for a monitor to subscribe (:data:`JOIN_GRACE_S`, :data:`JOIN_CONNECTING_S`);
        a closing rank waits no longer than its close allows."""
        link, until = self._link, started + JOIN_GRACE_S
        if link.connecting():
            until = started + JOIN_CONNECTING_S
        elif link.ready_at is not None:  # the subscription is the monitor's first message after the handshake
            until = max(until, min(link.ready_at + JOIN_GRACE_S, started + JOIN_CONNECTING_S))
        return min(until, self._flush_until) if stopping else until

    def _subscribed(self, sock: zmq.Socket[bytes]) -> bool:
        """True if a monitor subscribed since the last look (XPUB hands us b'\\x01' + topic)."""
        joined = False
        while True:
            try:
                message = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return joined
            joined = joined or message[:1] == b"\x01"

    def _drain(self, sock: zmq.Socket[bytes], stopping: bool) -> bool:
        """Send what is queued, in order; True if it stopped at an iteration whose CUDA events have not run yet."""
        while self._queue:
            kind, body, events = self._queue[0]
            if kind == "buckets":
                self._queue.popleft()
                self._buckets = body
                self._send_buckets(sock)
                continue
            if self._resolver is not None:
                if not self._resolver.ready(events):
                    if not stopping:
                        return True  # the GPU has not run this iteration yet; later ones are behind it
                    self._queue.popleft()  # a closing rank does not wait for the GPU
                    self.dropped_send += 1
                    continue
                resolved = self._resolver.resolve(events)
                if resolved is None:  # closed meanwhile: the GPU's times can no longer be read
                    self._queue.popleft()
                    self.dropped_send += 1
                    continue
                events = resolved
            events = fill_spans(events)
            self._queue.popleft()
            iteration, cpu = body
            self.iterations = iteration + 1
            self._send(sock, wire.encode_iteration(self.seq, self.rank, iteration, events, self.dropped,
                                                   self.dropped_queue, self.sender, cpu))
        return False
