"""instrument.sockets.Link: which TCP connection a connecting socket holds, and what the kernel has not had
acknowledged on it (the end-to-end cases, over real links between namespaces, are in tests/test_faults.py)."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable

import pytest
import zmq
from helpers.waits import WAIT_S
from zmq.utils.monitor import recv_monitor_message

from dagtop.demo.launch import free_endpoint
from instrument.sockets import ATTEMPT_EVENTS, CONNECT_TIMEOUT_MS, CONNECTION_EVENTS, Link

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIOCOUTQ is Linux's")


def test_the_link_follows_the_connection_a_socket_makes_and_loses() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoint = free_endpoint()
    monitor, rank = context.socket(zmq.SUB), context.socket(zmq.XPUB)
    monitor.bind(endpoint)
    events = rank.get_monitor_socket(CONNECTION_EVENTS)
    link = Link()

    def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            assert time.monotonic() < deadline, what
            if events.poll(50):
                link.seen(recv_monitor_message(events))

    try:
        assert link.unacknowledged() is None  # no connection yet: nothing to wait for
        rank.connect(endpoint)
        until(lambda: link.fd is not None, "connected")
        until(lambda: link.unacknowledged() == 0, "nothing unacknowledged on an idle connection")
        monitor.close(linger=0)
        until(lambda: link.fd is None, "the connection's loss")
    finally:
        rank.disable_monitor()
        events.close(linger=0)
        rank.close(linger=0)
        context.term()


def test_what_a_reader_that_does_not_read_leaves_unacknowledged_is_counted_and_waited_for() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    reader, _ = listener.accept()
    try:
        sender.setblocking(False)
        sent = 0
        try:
            while True:  # until the reader's window and the sender's buffer are full
                sent += sender.send(b"x" * 65536)
        except BlockingIOError:
            pass
        link = Link()
        link.seen({"event": zmq.EVENT_CONNECTED, "value": sender.fileno()})
        held = link.unacknowledged()
        assert held is not None and 0 < held <= sent
        began = time.monotonic()
        link.settle(lambda: None, began + 0.3)  # the reader never reads: the wait ends at its deadline, not before
        assert time.monotonic() - began >= 0.3
        deadline = time.monotonic() + WAIT_S
        while link.unacknowledged():  # the reader reads all: nothing left unacknowledged, and no wait
            assert time.monotonic() < deadline
            reader.recv(1 << 20)
        began = time.monotonic()
        link.settle(lambda: None, began + WAIT_S)
        assert time.monotonic() - began < WAIT_S / 2
        link.seen({"event": zmq.EVENT_DISCONNECTED, "value": sender.fileno()})
        assert link.fd is None and link.unacknowledged() is None
    finally:
        for s in (sender, reader, listener):
            s.close()


def test_a_refused_attempt_is_no_connection_on_its_way_and_an_unanswered_one_is() -> None:
    # A rank holds its first iterations while the connection is on its way (instrument/publisher.py): not for a port
    # nobody listens on, which is a monitor that is not there.
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    rank = context.socket(zmq.XPUB)
    events = rank.get_monitor_socket(ATTEMPT_EVENTS | CONNECTION_EVENTS)
    link, retried = Link(), 0
    try:
        rank.connect(free_endpoint())
        deadline = time.monotonic() + WAIT_S
        while retried < 2:
            assert time.monotonic() < deadline, "no attempt refused"
            if events.poll(50):
                event = recv_monitor_message(events)
                link.seen(event)
                if event["event"] == zmq.EVENT_CONNECT_RETRIED:
                    retried += 1
                    assert not link.connecting(), event
    finally:
        rank.disable_monitor()
        events.close(linger=0)
        rank.close(linger=0)
        context.term()
    unanswered = Link()
    unanswered.seen({"event": zmq.EVENT_CONNECT_DELAYED, "value": 115})  # EINPROGRESS: a SYN is out
    assert unanswered.connecting()
    time.sleep(CONNECT_TIMEOUT_MS / 1000)  # ZeroMQ gives it up unanswered, and will try again
    unanswered.seen({"event": zmq.EVENT_CONNECT_RETRIED, "value": 250})
    assert unanswered.connecting()
    unanswered.seen({"event": zmq.EVENT_CONNECTED, "value": 7})
    assert unanswered.connecting()  # ZeroMQ's handshake is still to come, and the subscription after it
    unanswered.seen({"event": zmq.EVENT_HANDSHAKE_SUCCEEDED, "value": 0})
    assert not unanswered.connecting() and unanswered.ready_at is not None
    refused = Link()
    refused.seen({"event": zmq.EVENT_CONNECTED, "value": 7})
    refused.seen({"event": zmq.EVENT_HANDSHAKE_FAILED_AUTH, "value": 0})  # keys the monitor does not take
    assert not refused.connecting() and refused.ready_at is None
