"""Collectives whose end the training thread notices (:class:`Polled`): on the host clock, with no callback in torch.

A callback on a gloo work's future runs on the gloo thread that completes it, and must first take the GIL. While
the training thread runs Python (the shim's hooks at every unit of the backward), the gloo thread waits for it, up
to the interpreter's switch interval, and the next bucket's all-reduce waits behind it. With a bucket per layer (41
small layers, ``bucket_cap_mb=0.02``, 2 gloo ranks of a 2-core VM, arms interleaved in one job, paired per block),
the shim with such a callback ran the job at ×0.57-0.68 of its plain throughput, noticing the end as below at
×0.82-0.88 (three runs; benchmarks/bench_bucket_ends.py, which also holds both against the profiler's ends).

So on the host clock the reducer is handed the work itself, and the training thread looks at the futures in flight
at moments it stamps anyway: each bucket handed over and each unit boundary of the backward (the node prehooks of
instrument/unit.py). A bucket's end is the first of those moments at which its future is done: never early, late
by at most the gap between two of them (one unit's backward). At the end of the backward, where DDP waits for
every bucket before the optimizer may run, the shim waits for them first (an autograd final callback queued before
DDP's own), one by one, noting each end as it comes: the buckets the backward does not hide are timed to the moment.
The GPU's clock needs none of this: a CUDA event is recorded in the future's callback (instrument/comm.py).

Not done: a callback added to the work's own future, the reducer not waiting for it (#29): gloo's thread still waits
for the GIL, and the end is stamped late, during the optimizer step in 10-20 % of iterations. Nor a thread of the
shim's own waiting on each future: it too must take the GIL to stamp, and it would be inside torch, waiting, when
the interpreter exits mid-backward (instrument/teardown.py).

Only the training thread touches what is in flight here (the heartbeat reads the bucket timer's own copy).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

Finish = Callable[[int], None]
"""Records a collective as ended at the given ``perf_counter_ns``."""


class Polled:
    """The collectives in flight on the host clock, each with what records its end."""

    __slots__ = ("_fail", "open", "queued")

    def __init__(self, fail: Callable[[BaseException], None]) -> None:
        self._fail = fail
        self.open: list[tuple[Any, Finish]] = []
        """(future, finish) of each collective handed over and not seen done, in the order they were handed over."""
        self.queued = False
        """The wait at the end of this backward is queued (until it runs: a backward that raises never runs it)."""

    def watch(self, future: Any, finish: Finish) -> None:
        """Note a collective just issued in a backward: ``finish(now)`` once a look finds ``future`` done."""
        self.open.append((future, finish))
        if not self.queued:
            self.queued = _at_backward_end(self._settle)

    def poll(self, now: int, stamped: Mapping[int, int] | None = None) -> None:
        """Finish every collective whose future is done (called on the training thread only): at ``now``, or at the
        moment its future's callback stamped in ``stamped`` (by ``id`` of the future), where it did."""
        left = []
        for entry in self.open:
            if entry[0].done():
                entry[1](now if stamped is None else stamped.get(id(entry[0]), now))
            else:
                left.append(entry)
        self.open = left

    def forget(self) -> None:
        """Let go of what is still open (a backward that never finished: its collectives end with it)."""
        self.open = []
        self.queued = False

    def _settle(self) -> None:
        """The backward is over and DDP's own wait for every bucket comes next (its final callback, queued when its
        last bucket was ready, after this one): wait for them here instead, in the order they were handed over,
        noting each end as it comes. The training thread waits outside the GIL, as DDP's wait would, and takes it
        back at once (no hook of the shim runs now): what the backward hid was noticed by then, what it did not
        is noted to the moment.

        Gloo runs two all-reduces at once, and a later, smaller one ends first: waited for in order, it would be
        noticed when the one before it ended (over a 1 Gbit/s link a 4 MiB bucket beside a 25 MiB one was noted
        238 ms long where it took 59-71). So each still in flight gets a callback that stamps its end: it runs on
        gloo's thread, which finds the GIL free while the training thread waits here (the hazard of such callbacks
        during the backward, above, is that the thread holds it)."""
        self.queued = False
        try:
            self.poll(time.perf_counter_ns())
            stamped: dict[int, int] = {}
            for future, _ in self.open:
                future.then(functools.partial(_stamp, stamped, id(future)))
            while self.open:
                with contextlib.suppress(Exception):  # a failed collective: DDP's own wait raises it, as without dagtop
                    self.open[0][0].wait()
                left = len(self.open)
                self.poll(time.perf_counter_ns(), stamped)
                if len(self.open) == left:  # not done after its wait: leave it to DDP
                    break
        except Exception as exc:  # noqa: BLE001 - an autograd callback: never reach the training loop
            self._fail(exc)


def _stamp(stamped: dict[int, int], key: int, _: Any) -> None:
    """A future's callback, run by the thread that completes it: notes the moment under ``key``."""
    stamped[key] = time.perf_counter_ns()


def _at_backward_end(callback: Callable[[], None]) -> bool:
    """Queue ``callback`` among the running backward's final callbacks; False where there is no backward to end
    (then the tracer's look at the optimizer step notices the collective instead)."""
    from torch.autograd import Variable

    try:
        Variable._execution_engine.queue_callback(callback)
    except Exception:  # noqa: BLE001 - "only during backward"
        return False
    return True
