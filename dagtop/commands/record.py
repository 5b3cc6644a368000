"""``dagtop record``: collect every rank's frames headless into a recording, until N iterations are complete."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from dagtop.exits import Exit
from dagtop.io.output import why
from dagtop.io.recording import RecordingWriter
from dagtop.io.sources import FrameSource, bind_live
from dagtop.model.admission import Admission
from dagtop.model.completion import missing
from dagtop.model.frames import RawFrame
from dagtop.model.jobs import Losses
from instrument import wire

ITERATIONS_KEPT = 4096
"""Iterations whose ranks the recorder keeps track of; past this the oldest is forgotten (bounded memory)."""
NOTE_EVERY_S = 1.0
"""How often, at most, the recorder writes its intake note (the rejections so far) into the recording."""


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
    """'iterations', 'timeout', 'bye', 'stopped', 'interrupted' or 'disk'."""
    written: int = 0
    """Frames written to the recording: those taken in (rejected frames and duplicates are only counted)."""
    rejections: dict[str, int] = field(default_factory=dict)
    """Rejected frames by reason (:func:`~dagtop.model.admission.reason_of`)."""
    refused: int = 0
    """Connections refused by CURVE authentication (``--auth``): a rank without the key, or with a wrong one."""
    disk_error: str = ""
    """Why the recording could not be written on ('disk'), in one line."""
    lost: Losses = field(default_factory=Losses)
    """What never arrived, by reason (as of the last frame that changed it)."""
    runs: int = 0
    """Runs of the job seen: a restart begins a new one."""

    def line(self) -> str:
        expected = "?" if self.ranks_expected is None else str(self.ranks_expected)
        text = (
            f"{self.frames} frames · ranks {len(self.ranks_seen)}/{expected} · "
            f"{self.complete} complete iterations · {self.rejected} rejected"
        )
        if self.rejections:
            top = sorted(self.rejections.items(), key=lambda kv: -kv[1])
            reasons = ", ".join(f"{reason} ×{n}" for reason, n in top[:3])
            text += f" ({reasons}{', …' if len(top) > 3 else ''}; first: {self.first_rejection})"
        elif self.first_rejection:
            text += f" (first: {self.first_rejection})"
        if self.refused:
            text += f" · {self.refused} refused by --auth"
        if self.lost.dropped:
            text += f" · {self.lost.dropped} frames lost ({self.lost.transit} on the way)"
        if self.runs > 1:
            text += f" · {self.runs} runs (restarted)"
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

    def note(self, raw: RawFrame) -> bool:
        """Fold one frame into the progress; whether it was taken in (decoded, not rejected, not a duplicate):
        only those are written to the recording."""
        p, admission = self.progress, self.admission
        rejected, taken_in = admission.rejected, admission.taken_in
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
                while len(p.iterations) > ITERATIONS_KEPT:  # iteration numbers that jump about: forget the oldest
                    oldest = min(p.iterations)
                    del p.iterations[oldest]
                    self.waiting.discard(oldest)
        if ranks_changed:  # a world size or a bye changes which ranks an iteration awaits
            self._count(sorted(self.waiting))
            p.runs = len(admission.jobs.runs)
            p.lost = admission.losses
        if admission.rejected > rejected:
            p.rejected = admission.rejected
            p.first_rejection = p.first_rejection or (admission.last_rejection or "")[:120]
            p.rejections = admission.rejections
        return admission.taken_in > taken_in

    def _count(self, iterations: Iterable[int]) -> None:
        p = self.progress
        # Every rank below its run's world size is awaited but those that said bye: an iteration with fewer ranks in
        # cannot be complete. That settles all but an iteration's last frame at no cost (the rule is O(world)).
        for it in iterations:
            have = p.iterations[it]
            run = self.admission.run_of(it)
            if run is None:
                continue
            if it in self.waiting and len(have) >= run.world - run.byes and not missing(self.admission, it, have):
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
    kept either way), or when the recording cannot be written on ('disk': the file keeps every whole record
    written before). Only frames taken in are written: a frame that does not decode, that the model would reject
    (a rank at or above the world size) or a duplicate is counted by reason, and the counts go into the
    recording as the recorder's intake note (about once a second while they change, and at the end), never the
    frame itself, so junk cannot fill the disk. Only frames taken in restart the ``timeout``.

    Args:
        ranks: ranks to expect; default the largest world size in the ranks' hellos.
        progress: called with the progress about five times a second, and once at the end.
    """
    state = RecordProgress(ranks_expected=ranks)
    tally = _Tally(state, ranks)
    last_frame = time.monotonic()
    last_report = last_note = 0.0
    noted = (0, 0)
    try:
        while True:
            frames = source.poll(0.05)
            now = time.monotonic()
            for raw in frames:
                state.frames += 1
                if tally.note(raw):
                    _write(writer.append, raw)
                    state.written += 1
                    last_frame = now
            state.refused = source.refused
            if (state.rejected, state.refused) != noted and now - last_note >= NOTE_EVERY_S:
                _write(writer.note, intake_note(state))
                noted, last_note = (state.rejected, state.refused), now
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
    except _WriteFailed as failed:
        state.stopped_because, state.disk_error = "disk", _disk_error(failed.error, writer)
    state.lost, state.runs = tally.admission.losses, len(tally.admission.jobs.runs)
    if state.stopped_because != "disk" and (state.rejected, state.refused) != noted:
        try:
            _write(writer.note, intake_note(state))
        except _WriteFailed as failed:
            state.stopped_because, state.disk_error = "disk", _disk_error(failed.error, writer)
    if progress is not None:
        progress(state)
    return state


class _WriteFailed(Exception):
    """The recording could not be written on; the source's own errors are not this."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _write(call: Callable[[Any], None], what: Any) -> None:
    try:
        call(what)
    except OSError as exc:
        raise _WriteFailed(exc) from exc


def intake_note(state: RecordProgress) -> dict[str, Any]:
    """The recorder's intake note, as ``report --json`` shows it under ``intake`` (docs/report.md)."""
    return {"k": "intake", "frames": state.frames, "rejected": state.rejected,
            "reasons": dict(state.rejections), "first": state.first_rejection or "", "refused": state.refused}


def _disk_error(exc: OSError, writer: RecordingWriter) -> str:
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"cannot write {writer.path}: {why}; stopped, {writer.frames} frames kept (the file reads as it is)"


class ProgressLine:
    """One status line on a terminal, rewritten in place; on a pipe only the final line is written."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr  # looked up now, not at import: tests and callers may replace it
        self._tty = self._stream.isatty()

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
    bound = bind_live("dagtop record", args.bind, getattr(args, "auth", None))
    if isinstance(bound, int):
        return bound
    source: FrameSource = bound
    if getattr(args, "metrics_port", None) is not None:  # analysed on the side, for Prometheus only
        from dagtop.interop.metrics import MeteredSource, MetricsError
        from dagtop.model.advice_text import terms_of

        try:
            source = MeteredSource(source, args.metrics_port, args.ranks, terms_of(args))
        except MetricsError as exc:
            source.close()
            print(f"dagtop record: {exc}", file=sys.stderr)
            return Exit.CANNOT_BIND
    if hasattr(signal, "SIGXFSZ"):  # past `ulimit -f`, a write fails with EFBIG (handled) instead of a core dump
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    line = ProgressLine()
    try:
        writer = RecordingWriter(args.output)
    except OSError as exc:
        source.close()
        print(f"dagtop record: cannot write {args.output}: {why(exc, args.output)}", file=sys.stderr)
        return Exit.DISK
    with writer:
        try:
            result = record(source, writer, args.iterations, args.timeout, args.ranks, line)
        finally:
            source.close()
    line.finish(result)
    return _exit_status(result, args, writer.frames)


def _exit_status(result: RecordResult, args: argparse.Namespace, frames: int) -> int:
    if result.stopped_because == "disk":
        print(f"dagtop record: {result.disk_error}", file=sys.stderr)
        return Exit.DISK
    if result.stopped_because == "timeout":
        if result.frames == 0 and result.refused:  # the job runs: its ranks hold no key, or another one
            print(f"dagtop record: nothing received on {args.bind} for {args.timeout:g} s: --auth refused every rank "
                  f"that connected ({result.refused} connections); give the ranks DAGTOP_AUTH=DIR with the rank key "
                  f"of {args.auth} (`dagtop keygen`)", file=sys.stderr)
        elif result.frames == 0:
            print(f"dagtop record: nothing received on {args.bind} for {args.timeout:g} s; is the job running with "
                  f"DAGTOP_ENDPOINT={args.bind}? ({frames} frames kept in {args.output})", file=sys.stderr)
        else:  # it was: it ended without its byes (frames a rank had not sent went with it), or the way is down
            print(f"dagtop record: nothing more received on {args.bind} for {args.timeout:g} s: the ranks ended "
                  f"without saying bye, or the way to them is down ({frames} frames kept in {args.output})",
                  file=sys.stderr)
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
