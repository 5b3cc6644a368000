"""The collector: polls a frame source, folds frames into the Pipeline and keeps the latest snapshot.

It runs in a thread worker and never touches a widget. The UI thread reads :attr:`Collector.latest`
on a fixed frame interval; a burst of frames only ever replaces that one reference, so nothing queues
up and the screen cannot fall behind the job.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from dagtop.io.sources import FrameSource
from dagtop.io.telemetry import Sampler, TelemetrySample
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import EMPTY_SNAPSHOT, Snapshot

POLL_S = 0.1
"""Longest wait for frames in one poll: also how soon a cancel is noticed."""
BATCH_S = 0.1
"""Live, the fewest seconds from one poll that found frames to the next: what comes meanwhile waits in the socket
and is folded in one batch (one lock, one settle), not a thread wake-up per rank's frame."""
MAX_BATCH = 5_000
"""Frames folded per poll at most, so a replay at full speed still publishes snapshots as it goes."""
THAW_EVERY_S = 60.0
"""How often what folding froze out of the garbage collector's scans is put back and collected once (see
:meth:`Collector.fold`): what bounds how long a reference cycle caught by a freeze outlives its use. One full
collection: about 20 ms at 1024 ranks of 400 events with 12 iterations kept (35 000 objects), less with fewer."""


@dataclass(frozen=True, slots=True)
class Update:
    """What the collector hands to the screen: a snapshot, the latest telemetry, and a version to spot news."""

    version: int
    snapshot: Snapshot
    telemetry: TelemetrySample | None
    error: str | None = None
    """Why collecting stopped (the source failed), for the screen to say."""


class Collector:
    """Owns the source and the pipeline; :meth:`run` is the body of the worker thread.

    Args:
        source: live socket or recording.
        pipeline: the model; built with ``expected_ranks`` when None.
        sampler: the monitor's own machine, sampled only while the job sends no telemetry of its own (None: never,
            as in replay).
        telemetry_every_s: how often to sample telemetry.
        publish_every_s: the fewest seconds between two snapshots (building one costs; the screen takes 2/s).
        clock: monotonic ns, the same clock the live source stamps frames with (to give up on late ranks);
            pacing (publishing, telemetry) always runs on the real monotonic clock.
    """

    def __init__(self, source: FrameSource, pipeline: Pipeline | None = None, sampler: Sampler | None = None,
                 telemetry_every_s: float = 1.0, publish_every_s: float = 0.2,
                 clock: Callable[[], int] = time.perf_counter_ns, expected_ranks: int | None = None) -> None:
        self.source = source
        self.pipeline = pipeline or Pipeline(expected_ranks=expected_ranks)
        self.sampler = sampler
        self.telemetry_every_ns = int(telemetry_every_s * 1e9)
        self.publish_every_ns = int(publish_every_s * 1e9)
        self.clock = clock
        self.latest = Update(0, EMPTY_SNAPSHOT, None)
        """The newest update: replaced whole (one reference assignment), read by the UI thread."""
        self.frames_folded = 0
        self._telemetry: TelemetrySample | None = None
        self._last_telemetry_ns: int | None = None
        self._last_publish_ns = -self.publish_every_ns
        self._dirty = False
        self._telemetry_new = False
        self._finished = False
        self._thawed_at = time.monotonic()

    def step(self) -> None:
        """One poll and fold; publishes when due. Call repeatedly from one thread."""
        now = started = time.monotonic_ns()
        # The monitor's own machine stands in only until the job sends its telemetry.
        if self.sampler is not None and not self.latest.snapshot.telemetry and (
                self._last_telemetry_ns is None or now - self._last_telemetry_ns >= self.telemetry_every_ns):
            self._telemetry = self.sampler()
            self._last_telemetry_ns = now
            self._telemetry_new = True
        frames: list[RawFrame] = []
        if self._finished:
            time.sleep(POLL_S)
        else:
            frames = self.source.poll(POLL_S, MAX_BATCH)
            if frames:
                self.fold(frames)
                self.frames_folded += len(frames)
                self._dirty = True
            if self.source.finished:
                self.pipeline.finish()
                self._finished = self._dirty = True
            elif self.source.live:
                given_up, liveness = self.pipeline.incomplete, self.pipeline.liveness.view
                self.pipeline.expire(self.clock())
                # With every rank silent, only the passing time says more: a stall's line, a rank gone.
                self._dirty |= self.pipeline.incomplete != given_up or self.pipeline.liveness.view != liveness
        now = time.monotonic_ns()
        due = self._finished or now - self._last_publish_ns >= self.publish_every_ns
        if (self._dirty and due) or self._telemetry_new:
            self.publish()
            self._last_publish_ns = now
        if frames and self.source.live:
            time.sleep(max(0.0, BATCH_S - (time.monotonic_ns() - started) / 1e9))

    def fold(self, frames: list[RawFrame]) -> None:
        """Feed the pipeline with the cyclic garbage collector held off, then freeze what folding made.

        An iteration's analysis leaves about 2 900 objects at 1024 ranks (rows, segments, collectives), kept while
        it stays in the window. They hold no reference cycle, but the collector cannot know: it walks each in every
        young collection it lives through, then in the full collections, which come whenever what survived has
        grown by a quarter. Folding makes no cycles (past the first iteration's imports), so no collection runs
        meanwhile, and ``gc.freeze`` then takes what is alive out of every later scan (it is still freed by its
        reference counts). When each task was a tuple (410 000 an iteration at 1024 ranks) this was half the
        monitor's time; with the tasks kept as columns (:mod:`dagtop.model.tasks`) it saves about 2 points of a
        core at 1024 ranks (34 % against 36 %, two runs each of benchmarks/bench_scale.py).

        What came since the last freeze (the UI thread's objects, the snapshots: little) is collected first, so
        that the garbage among it is not frozen. A cycle frozen alive that dies later (the UI thread's) waits for the
        next thaw, every :data:`THAW_EVERY_S`: all put back, collected once, frozen again.
        """
        if not gc.isenabled():  # whoever turned the collector off is managing it
            self.pipeline.feed(frames)
            return
        gc.collect()  # only what is not frozen: what came since the last freeze
        gc.disable()
        try:
            self.pipeline.feed(frames)
            gc.freeze()  # before any allocation after enable() would start a collection of all the fold made
        finally:
            gc.enable()
        if time.monotonic() - self._thawed_at >= THAW_EVERY_S:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._thawed_at = time.monotonic()

    def publish(self, error: str | None = None) -> None:
        """Make the latest update: a new snapshot only if the model changed (the screen redraws on a new one)."""
        snapshot = self.pipeline.snapshot() if self._dirty or error else self.latest.snapshot
        self.latest = Update(self.latest.version + 1, snapshot, self._telemetry, error)
        self._dirty = self._telemetry_new = False

    def run(self, cancelled: Callable[[], bool]) -> None:
        """Step until ``cancelled()``; a failing source ends collecting with its error published."""
        try:
            while not cancelled():
                self.step()
        except Exception as exc:
            self.publish(error=f"collecting stopped: {type(exc).__name__}: {exc}")
            raise
