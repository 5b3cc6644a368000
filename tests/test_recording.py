"""Recordings: what was appended reads back; a cut tail is skipped and flagged; a foreign file is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagtop.io.recording import MAGIC, RecordingError, RecordingReader, RecordingWriter, read_recording
from dagtop.io.sources import RecordingSource
from dagtop.model.frames import RawFrame

FRAMES = [RawFrame(1_000 + i, bytes([i]) * (i * 7)) for i in range(10)]


def _write(path: Path, frames: list[RawFrame] = FRAMES) -> Path:
    with RecordingWriter(path) as writer:
        for frame in frames:
            writer.append(frame)
    return path


def test_frames_read_back_in_order_with_receive_times(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.dagtop")
    reader = RecordingReader(path)
    assert list(reader) == FRAMES
    assert reader.truncated is False


@pytest.mark.parametrize("cut", [1, 5, 12, 13, 30])
def test_a_cut_tail_is_skipped_and_flagged(tmp_path: Path, cut: int) -> None:
    """A monitor killed mid-write leaves a partial record: the complete ones still read back."""
    path = _write(tmp_path / "run.dagtop")
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    reader = RecordingReader(path)
    frames = list(reader)
    assert reader.truncated is True
    assert frames == FRAMES[: len(frames)]
    assert len(frames) == len(FRAMES) - 1


def test_an_empty_recording_has_no_frames(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.dagtop", [])
    assert path.read_bytes() == MAGIC
    assert read_recording(path) == []


@pytest.mark.parametrize("content", [b"", b"DAGTOP", b"PK\x03\x04 a zip file", MAGIC[:-1] + b"\x02"])
def test_bad_magic_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "not.dagtop"
    path.write_bytes(content)
    with pytest.raises(RecordingError, match="not a dagtop recording"):
        RecordingReader(path)


def test_an_absurd_record_length_is_an_error_not_an_allocation(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.dagtop"
    path.write_bytes(MAGIC + (0xFFFFFFFF).to_bytes(4, "little") + (0).to_bytes(8, "little"))
    with pytest.raises(RecordingError, match="corrupt"):
        read_recording(path)


def test_recording_source_plays_everything_then_finishes(tmp_path: Path) -> None:
    source = RecordingSource(_write(tmp_path / "run.dagtop"))
    got: list[RawFrame] = []
    while not source.finished:
        got += source.poll(0.01, max_frames=3)
    assert got == FRAMES
