"""Leaving cleanly: nothing of dagtop's is freed, or calls into torch, on a thread the interpreter may end.

Once the interpreter is finalizing, any thread that takes the GIL is ended with ``pthread_exit``; where the
unwinding crosses a C++ ``noexcept`` destructor, the process calls ``std::terminate`` ("terminate called without
an active exception", SIGABRT) after its work is done. Core dumps of jobs that left mid-backward (an exception,
``sys.exit``, a SIGTERM handler) showed a gloo worker thread there, freeing Python objects it had been handed:

- dagtop's callback on a bucket's future: torch frees it on the thread that completes the future, in a guard
  whose destructor takes the GIL. :class:`Pending` counts the callbacks torch still holds, and ``close()`` (run
  at exit too) waits for them.
- the backward's ``contextvars.Context``, which torch keeps in its thread-local state for the autograd engine's
  device threads and every gloo work copies (plain DDP aborts on it too). :func:`unstash_context` keeps it out
  of what dagtop hands over.

And on a GPU rank the publisher thread calls into torch (CUDA events), where a call that released the GIL
takes it back on return: :class:`Gate` keeps the thread out of torch once ``close()`` has returned.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from instrument.events import RawEvent

GATE_TIMEOUT_S: Final = 10.0
"""How long ``close()`` waits, past its own timeout, for a call into torch under way on the publisher thread (an
event query or an idle stream's synchronize: micro- to milliseconds; seconds on a loaded machine)."""
CONTEXT_KEY: Final = "context"
"""Where ``torch.autograd.graph._engine_run_backward`` keeps the backward's ``contextvars.Context`` in torch's
thread-local state (torch 2.13)."""


class GpuResolver(Protocol):
    """Turns an iteration's CUDA events into CPU-clock nanoseconds once the GPU has run them."""

    def ready(self, events: Sequence[RawEvent]) -> bool: ...

    def resolve(self, events: Sequence[RawEvent]) -> list[RawEvent]: ...

    def calibrate(self) -> None: ...

    def enter_thread(self) -> None: ...


class Pending:
    """Callbacks dagtop handed to torch futures and torch has not freed yet (each carries a :class:`Held`)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.count = 0

    def add(self) -> None:
        with self._changed:
            self.count += 1

    def release(self) -> None:
        with self._changed:
            self.count -= 1
            if not self.count:
                self._changed.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait until torch has freed every callback, up to ``timeout_s``; True if it has."""
        with self._changed:
            return self._changed.wait_for(lambda: self.count == 0, timeout_s)


class Held:
    """Rides in a callback's defaults: freed with the callback, on whatever thread torch frees it, it counts
    itself out of its :class:`Pending`."""

    __slots__ = ("_pending",)

    def __init__(self, pending: Pending) -> None:
        self._pending = pending
        pending.add()

    def __del__(self) -> None:
        self._pending.release()


@functools.cache
def _tls() -> tuple[Callable[..., Any] | None, ...]:
    """torch's functions over its thread-local Python objects, None where this torch lacks them (imported
    here, on first use: the publisher imports this module and must not load torch)."""
    import torch

    return tuple(getattr(torch._C, name, None)
                 for name in ("_is_key_in_tls", "_get_obj_in_tls", "_remove_obj_from_tls", "_stash_obj_in_tls"))


def unstash_context() -> Any:
    """Take the backward's Python context out of torch's thread-local state while a bucket is handed over (the
    collective and dagtop's callback need none); returns it for :func:`restash_context`, or None."""
    is_in, get, remove, _ = _tls()
    if is_in is None or get is None or remove is None or not is_in(CONTEXT_KEY):
        return None
    context = get(CONTEXT_KEY)
    remove(CONTEXT_KEY)
    return context


def restash_context(context: Any) -> None:
    stash = _tls()[3]
    if context is not None and stash is not None:
        stash(CONTEXT_KEY, context)


class Gate:
    """The publisher thread's way into torch (a :class:`GpuResolver`), shut for good by
    ``close()``: each call holds the gate's lock, and :meth:`shut` waits for the call under way, so that after
    it the thread never enters torch again (what it still sends goes without the GPU's times, and is counted)."""

    def __init__(self, resolver: GpuResolver) -> None:
        self._resolver = resolver
        self._lock = threading.Lock()
        self._open = True

    def shut(self, timeout_s: float) -> bool:
        """Close the gate once no call is under way (up to ``timeout_s``); True when it is closed."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        self._open = False
        self._lock.release()
        return True

    def ready(self, events: Sequence[RawEvent]) -> bool:
        with self._lock:
            return self._open and self._resolver.ready(events)

    def resolve(self, events: Sequence[RawEvent]) -> list[RawEvent] | None:
        """The events on the CPU clock, or None once the gate is shut (the frame cannot be sent)."""
        with self._lock:
            return self._resolver.resolve(events) if self._open else None

    def calibrate(self) -> None:
        with self._lock:
            if self._open:
                self._resolver.calibrate()

    def enter_thread(self) -> None:
        with self._lock:
            if self._open:
                self._resolver.enter_thread()
