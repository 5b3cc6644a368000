"""Every way a timed job ends leaves its ranks' exit status as it would be without dagtop: no abort at exit
("terminate called without an active exception", issue #30).

The causes found (core dumps of the ``raise-in-backward`` and ``sigterm`` orders): a gloo worker thread frees,
after a collective, Python objects it was handed: dagtop's callback given to ``Future.then`` (its guard takes
the GIL in a ``noexcept`` destructor), and the backward's ``contextvars.Context`` that torch keeps in its
thread-local state and every gloo work copies (plain DDP aborts there too). During interpreter finalization a
thread that takes the GIL is ended with ``pthread_exit``, and the unwinding calls ``std::terminate``. ``close()``
(atexit) now waits until torch has freed dagtop's callbacks, the tap hands buckets over without the context, and
the publisher thread is kept out of torch once closed. Each order of tests/jobs/teardown.py runs once here;
benchmarks/stress_teardown.py runs hundreds.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from helpers.waits import WAIT_S, until
from ranks import JOBS, run_job

from instrument import wire
from instrument.publisher import Publisher
from instrument.teardown import Gate, Held, Pending

sys.path.insert(0, str(JOBS))
from helpers.frames import hello
from teardown import EXPECTED, ORDERS


@pytest.mark.slow
@pytest.mark.parametrize("order", ORDERS)
def test_each_way_a_job_ends_keeps_its_exit_status(order: str, endpoint: str) -> None:
    run = run_job("teardown.py", "--order", order, endpoint=endpoint)
    assert "terminate called" not in run.log and "Fatal Python error" not in run.log, run.log[-4000:]
    assert all(code in EXPECTED[order] for code in run.returncodes), (run.returncodes, run.log[-4000:])


def test_pending_counts_callbacks_until_they_are_freed_on_another_thread() -> None:
    pending = Pending()
    callbacks: list[Any] = []
    for _ in range(3):
        def done(future: Any, held: Held = Held(pending)) -> Any:  # noqa: B008 - as instrument/comm.py does it
            return future
        callbacks.append(done)
    del done
    assert pending.count == 3 and not pending.wait(0.0)
    freer = threading.Thread(target=callbacks.clear)  # as a gloo worker frees them after running them
    freer.start()
    assert pending.wait(WAIT_S) and pending.count == 0
    freer.join(WAIT_S)


class _BlockingResolver:
    """A resolver whose ``ready`` blocks until released, as a CUDA call may; counts its calls."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0
        self.inside = False

    def ready(self, events: Any) -> bool:
        self.calls += 1
        self.inside = True
        self.entered.set()
        self.release.wait(WAIT_S)
        self.inside = False
        return False

    def resolve(self, events: Any) -> list[tuple[Any, ...]]:
        self.calls += 1
        return list(events)

    def calibrate(self) -> None:
        self.calls += 1

    def enter_thread(self) -> None:
        pass


def test_a_shut_gate_waits_for_the_call_under_way_and_lets_none_in_after() -> None:
    resolver = _BlockingResolver()
    gate = Gate(resolver)
    caller = threading.Thread(target=gate.ready, args=([],))
    caller.start()
    assert resolver.entered.wait(WAIT_S)
    shut: list[bool] = []
    closer = threading.Thread(target=lambda: shut.append(gate.shut(WAIT_S)))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and resolver.inside  # the call under way holds it
    resolver.release.set()
    closer.join(WAIT_S)
    caller.join(WAIT_S)
    assert shut == [True]
    calls = resolver.calls
    assert gate.ready([]) is False and gate.resolve([]) is None
    gate.calibrate()
    assert resolver.calls == calls  # nothing reaches torch once shut


def test_a_closed_publisher_never_calls_the_resolver_again(endpoint: str) -> None:
    """close() returns with the publisher thread still draining (it waits on the GPU): from then on the thread
    stays out of torch, whatever it still does."""
    resolver = _BlockingResolver()

    def said(seq: int) -> wire.Hello:
        return hello(seq=seq, device="cuda", mono_ns=0)

    publisher = Publisher(endpoint, 0, said, on_error=lambda exc: None, resolver=resolver)
    for it in range(3):
        publisher.put_iteration(it, [("compute", "forward", "net", "gpu", 1, 2, 0)])
    assert resolver.entered.wait(WAIT_S)
    gate = publisher._resolver
    assert gate is not None
    shutting = threading.Event()
    shut = gate.shut

    def noted_shut(timeout_s: float) -> bool:
        shutting.set()
        return shut(timeout_s)

    gate.shut = noted_shut  # type: ignore[method-assign]
    closer = threading.Thread(target=publisher.close, args=(0.05,))
    closer.start()
    assert shutting.wait(WAIT_S)  # the join gave up; the gate waits for the call under way
    assert closer.is_alive() and resolver.inside
    resolver.release.set()
    closer.join(WAIT_S)
    assert not closer.is_alive() and not resolver.inside
    calls = resolver.calls
    assert until(lambda: not publisher.alive)
    assert resolver.calls == calls
    assert publisher.dropped_send >= 1  # what it could not resolve was counted, not sent half-made


def test_the_job_file_lists_every_order_it_takes() -> None:
    text = (JOBS / "teardown.py").read_text()
    assert set(EXPECTED) == set(ORDERS) and all(f"``{order}``" in text for order in ORDERS)
