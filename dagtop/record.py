"""``dagtop record``: collect every rank's frames headless into a recording, until N iterations are complete."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from dagtop.recording import RecordingWriter
from dagtop.sources import FrameSource, ZmqSource
from instrument import wire

EXIT_TIMEOUT = 2
EXIT_SHORT = 1
EXIT_INTERRUPTED = 130


@dataclass
class RecordProgress:
    """What the recorder has seen so far; also the result once it stops."""

    frames: int = 0
    rejected: int = 0
    first_rejection: str | None = None
    ranks_seen: set[int] = field(default_factory=set)
    ranks_expected: int | None = None
    ranks_done: set[int] = field(default_factory=set)
    """Ranks that said bye."""
    iterations: dict[int, set[int]] = field(default_factory=dict)
    """Iteration number -> ranks that sent it."""
    complete: int = 0
    """Iterations with a frame from every expected rank."""
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


def _note(progress: RecordProgress, payload: bytes, ranks: int | None) -> None:
    """Fold one frame into the progress (the frame is already on disk, whatever it holds)."""
    try:
        frame = wire.decode(payload)
    except wire.WireError as exc:
        progress.rejected += 1
        progress.first_rejection = progress.first_rejection or str(exc)[:120]
        return
    progress.ranks_seen.add(frame.rank)
    if isinstance(frame, wire.Hello) and ranks is None and frame.world > (progress.ranks_expected or 0):
        progress.ranks_expected = frame.world
        progress.complete = sum(1 for seen in progress.iterations.values() if _complete(seen, frame.world))
    elif isinstance(frame, wire.IterationBatch):
        seen = progress.iterations.setdefault(frame.iteration, set())
        was = progress.ranks_expected is not None and _complete(seen, progress.ranks_expected)
        seen.add(frame.rank)
        if progress.ranks_expected is not None and not was and _complete(seen, progress.ranks_expected):
            progress.complete += 1
    elif isinstance(frame, wire.Bye):
        progress.ranks_done.add(frame.rank)


def _complete(seen: set[int], expected: int) -> bool:
    return sum(1 for r in seen if r < expected) == expected


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
    last_frame = time.monotonic()
    last_report = 0.0
    try:
        while True:
            frames = source.poll(0.05)
            now = time.monotonic()
            for raw in frames:
                writer.append(raw)
                state.frames += 1
                _note(state, raw.payload, ranks)
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
    except Exception as exc:  # zmq.ZMQError: address in use, bad endpoint
        print(f"dagtop record: cannot bind {args.bind}: {exc}", file=sys.stderr)
        return EXIT_SHORT
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
        return EXIT_TIMEOUT
    if result.stopped_because == "interrupted":
        print(f"dagtop record: interrupted; {frames} frames kept in {args.output}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.iterations is not None and result.complete < args.iterations:
        print(
            f"dagtop record: every rank finished after {result.complete} complete iterations, "
            f"fewer than the {args.iterations} asked for",
            file=sys.stderr,
        )
        return EXIT_SHORT
    return 0
