"""``dagtop record``: collect every rank's frames headless into a recording, until N iterations are complete."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TextIO

from dagtop.exits import Exit
from dagtop.model.admission import Admission
from dagtop.model.completion import missing
from dagtop.recording import RawFrame, RecordingWriter
from dagtop.sources import BindError, FrameSource, ZmqSource
from instrument import wire


@dataclass
class RecordProgress:
    """What the recorder has seen so far; also the result once it stops."""

    frames: int = 0
    rejected: int = 0
    first_rejection: str | None = None
    ranks_seen: set[int] = field(default_factory=set)
    """Ranks whose frames were taken in (a rank at or above the world size is rejected instead)."""
    ranks_expected: int | None = None
    """The world size: ``--ranks``, else the largest in the hellos (None before any)."""
    ranks_done: set[int] = field(default_factory=set)
    """Ranks that said bye (and not hello again since)."""
    iterations: dict[int, set[int]] = field(default_factory=dict)
    """Iteration number -> ranks that sent it."""
    complete: int = 0
    """Iterations complete by the model's rule: a frame from every rank below the world size that had not said
    bye before the iteration."""
    stopped_because: str = ""
    """'iterations', 'timeout', 'bye', 'stopped' or 'interrupted'."""

    def line(self) -> str:
        expected = "?" if self.ranks_expected is None else str(self.ranks_expected)
        text = (
            f"{self.frames} frames · ranks {len(self.ranks_seen)}/{expected} · "
            f"{self.complete} complete iterations · {self.rejected} rejected"
        )
        if self.first_rejection:
            text += f" (first: {self.first_rejection})"
        return text


RecordResult = RecordProgress


class _Tally:
    """Folds frames into a :class:`RecordProgress` as the screen and ``report`` would judge them, without
    analysing anything: the model's admission (ranks, world size, byes, duplicates, rejections) and its rule
    of a complete iteration (:func:`~dagtop.model.completion.missing`). An iteration counts once, when its
    last awaited frame is in; unlike the screen, the recorder never gives up on one."""

    def __init__(self, progress: RecordProgress, ranks: int | None) -> None:
        self.progress = progress
        self.admission = Admission(ranks)
        self.waiting: set[int] = set()
        """Iterations seen and not complete yet."""

    def note(self, raw: RawFrame) -> None:
        """Fold one frame into the progress (the frame is already on disk, whatever it holds)."""
        p, admission = self.progress, self.admission
        rejected = admission.rejected
        ranks_changed = False
        for _, frame in admission.admit(raw):
            p.ranks_seen.add(frame.rank)
            if isinstance(frame, (wire.Hello, wire.Bye)):
                p.ranks_expected = admission.world
                p.ranks_done = {r for r, s in admission.ranks.items() if s.bye is not None}
                ranks_changed = True
            elif isinstance(frame, wire.IterationBatch):
                p.iterations.setdefault(frame.iteration, set()).add(frame.rank)
                self.waiting.add(frame.iteration)
                self._count((frame.iteration,))
        if ranks_changed:  # a world size or a bye changes which ranks an iteration awaits
            self._count(sorted(self.waiting))
        if admission.rejected > rejected:
            p.rejected = admission.rejected
            p.first_rejection = p.first_rejection or (admission.last_rejection or "")[:120]

    def _count(self, iterations: Iterable[int]) -> None:
        p = self.progress
        # Every rank below the world size is awaited but those that said bye: an iteration with fewer ranks in
        # cannot be complete. That settles all but an iteration's last frame at no cost (the rule is O(world)).
        least = (self.admission.world or 0) - len(p.ranks_done)
        for it in iterations:
            have = p.iterations[it]
            if it in self.waiting and len(have) >= least and not missing(self.admission, it, have):
                self.waiting.discard(it)
                p.complete += 1


def record(
    source: FrameSource,
    writer: RecordingWriter,
    iterations: int | None = None,
    timeout: float | None = None,
    ranks: int | None = None,
    progress: Callable[[RecordProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RecordResult:
    """Append every frame from ``source`` to ``writer`` until a stop condition.

    Stops when ``iterations`` are complete on every rank, when nothing arrived for ``timeout`` seconds,
    when every expected rank said bye, when ``should_stop()`` is true, or on KeyboardInterrupt (the file is
    kept either way). Frames that fail to decode are recorded too: the recording is the raw truth.

    Args:
        ranks: ranks to expect; default the largest world size in the ranks' hellos.
        progress: called with the progress about five times a second, and once at the end.
    """
    state = RecordProgress(ranks_expected=ranks)
    tally = _Tally(state, ranks)
    last_frame = time.monotonic()
    last_report = 0.0
    try:
        while True:
            frames = source.poll(0.05)
            now = time.monotonic()
            for raw in frames:
                writer.append(raw)
                state.frames += 1
                tally.note(raw)
            if frames:
                last_frame = now
            if progress is not None and now - last_report >= 0.2:
                progress(state)
                last_report = now
            if iterations is not None and state.ranks_expected and state.complete >= iterations:
                state.stopped_because = "iterations"
                break
            if state.ranks_expected and len(state.ranks_done) >= state.ranks_expected:
                state.stopped_because = "bye"
                break
            if timeout is not None and now - last_frame >= timeout:
                state.stopped_because = "timeout"
                break
            if source.finished or (should_stop is not None and should_stop()):
                state.stopped_because = "stopped"
                break
    except KeyboardInterrupt:
        state.stopped_because = "interrupted"
    if progress is not None:
        progress(state)
    return state


class ProgressLine:
    """One status line on a terminal, rewritten in place; on a pipe only the final line is written."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._tty = stream.isatty()

    def __call__(self, state: RecordProgress) -> None:
        if self._tty:
            self._stream.write(f"\r\x1b[Kdagtop record: {state.line()}")
            self._stream.flush()

    def finish(self, state: RecordProgress) -> None:
        prefix = "\r\x1b[K" if self._tty else ""
        self._stream.write(f"{prefix}dagtop record: {state.line()}\n")
        self._stream.flush()


def run_record(args: argparse.Namespace) -> int:
    """The ``dagtop record`` command; returns the exit status."""
    try:
        source = ZmqSource(args.bind)
    except BindError as exc:
        print(f"dagtop record: {exc}", file=sys.stderr)
        return Exit.RECORD_CANNOT_BIND
    line = ProgressLine()
    with RecordingWriter(args.output) as writer:
        try:
            result = record(source, writer, args.iterations, args.timeout, args.ranks, line)
        finally:
            source.close()
    line.finish(result)
    return _exit_status(result, args, writer.frames)


def _exit_status(result: RecordResult, args: argparse.Namespace, frames: int) -> int:
    if result.stopped_because == "timeout":
        what = "nothing received" if result.frames == 0 else "nothing more received"
        print(
            f"dagtop record: {what} on {args.bind} for {args.timeout:g} s; is the job running with "
            f"DAGTOP_ENDPOINT={args.bind}? ({frames} frames kept in {args.output})",
            file=sys.stderr,
        )
        return Exit.TIMEOUT
    if result.stopped_because == "interrupted":
        print(f"dagtop record: interrupted; {frames} frames kept in {args.output}", file=sys.stderr)
        return Exit.INTERRUPTED
    if args.iterations is not None and result.complete < args.iterations:
        print(
            f"dagtop record: every rank finished after {result.complete} complete iterations, "
            f"fewer than the {args.iterations} asked for",
            file=sys.stderr,
        )
        return Exit.SHORT
    return Exit.OK
