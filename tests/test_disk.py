"""A full or failing disk: ``dagtop record`` stops writing with one line and exit status 4, and the file written so
far reads back whole (``dagtop report`` works on it)."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.frames import ListSource, hello
from helpers.waits import WAIT_S
from test_record import _hello, _iteration

from dagtop.commands.cli import main
from dagtop.commands.record import record
from dagtop.exits import Exit
from dagtop.io.recording import MAGIC, RecordingReader, RecordingWriter, read_recording
from dagtop.model.frames import RawFrame
from instrument import wire
from instrument.publisher import Publisher

LIMIT = 64 * 1024
"""RLIMIT_FSIZE of the recorder under test: a few hundred of the frames below."""


class _FailingFile:
    """A file that takes ``room`` bytes, then a part of the next write, then fails with ``error``."""

    def __init__(self, real: Any, room: int, error: int) -> None:
        self._real, self._room, self._error = real, room, error

    def write(self, data: memoryview) -> int:
        if self._room <= 0:
            raise OSError(self._error, os.strerror(self._error))
        n = min(len(data), self._room)
        self._room -= n
        return int(self._real.write(data[:n]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
def test_a_failing_write_stops_the_recorder_and_leaves_whole_records(tmp_path: Path, error: int) -> None:
    payloads = [_hello(0, 1)] + [_iteration(0, it) for it in range(200)]
    path = tmp_path / "r.dagtop"
    writer = RecordingWriter(path)
    writer._file = _FailingFile(writer._file, 3000, error)  # type: ignore[assignment]
    with writer:
        result = record(ListSource.of_payloads(payloads, batch=3), writer)
    assert result.stopped_because == "disk" and os.strerror(error) in result.disk_error
    assert str(writer.frames) in result.disk_error and "\n" not in result.disk_error
    reader = RecordingReader(path)
    frames = list(reader)
    assert not reader.truncated  # cut back to the last whole record
    assert [f.payload for f in frames] == payloads[:writer.frames] and 0 < writer.frames < len(payloads)
    assert path.stat().st_size <= 3000


def test_record_past_the_file_size_limit_exits_4_with_a_readable_file(
        tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`ulimit -f`: the kernel refuses writes past it (EFBIG; dagtop ignores SIGXFSZ, which would kill it)."""
    stop = threading.Event()

    def rank(r: int) -> None:
        def said(seq: int) -> wire.Hello:
            return hello(r, 2, seq, mono_ns=time.perf_counter_ns())

        publisher = Publisher(endpoint, r, said, on_error=lambda exc: None)
        it = 0
        while not stop.is_set():
            now = time.perf_counter_ns()
            events = [("compute", "forward", f"layers.{i}", "main", now + i, now + i + 1, 0) for i in range(20)]
            publisher.put_iteration(it, events)
            it += 1
            time.sleep(0.01)
        publisher.close()

    path = tmp_path / "r.dagtop"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o", str(path), "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    resource.prlimit(recorder.pid, resource.RLIMIT_FSIZE, (LIMIT, LIMIT))  # before any rank sends a frame
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    try:
        _, err = recorder.communicate(timeout=WAIT_S * 3)
    finally:
        stop.set()
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        for t in threads:
            t.join(10)
    assert recorder.returncode == Exit.DISK == 4, err
    lines = [line for line in err.splitlines() if line.startswith("dagtop record: cannot write")]
    assert len(lines) == 1 and os.strerror(errno.EFBIG) in lines[0] and "Traceback" not in err
    assert len(MAGIC) < path.stat().st_size <= LIMIT
    reader = RecordingReader(path)
    frames = list(reader)
    assert not reader.truncated and frames and all(wire.decode(f.payload) for f in frames)
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["truncated"] is False


def test_writer_appends_whole_records_in_one_write(tmp_path: Path) -> None:
    path = tmp_path / "r.dagtop"
    with RecordingWriter(path) as writer:
        for i in range(3):
            writer.append(RawFrame(i, _iteration(0, i)))
    assert [f.received_ns for f in read_recording(path)] == [0, 1, 2]
