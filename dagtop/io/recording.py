"""Crash-safe recordings: length-prefixed wire frames, appended as they arrive.

Layout: an 8-byte magic ``DAGTOP\\x00\\x01``, then records of ``<u32 length><u64 received_ns>``
followed by ``length`` bytes of one wire frame exactly as it came off the socket. A writer
writes every record whole with one system call, so a monitor killed mid-run leaves a file whose complete
records all read back; a record cut short at the tail is reported and skipped, never raised. A record stamped
:data:`NOTE_NS` is the recorder's own note (a msgpack map: what it refused on intake), not a frame; readers
keep the notes aside.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgpack

from dagtop.model.frames import RawFrame

if TYPE_CHECKING:
    from typing_extensions import Self

MAGIC: Final = b"DAGTOP\x00\x01"
_HEADER: Final = struct.Struct("<IQ")
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
NOTE_NS: Final = 2**64 - 1
"""The receive time that marks a record as the recorder's note rather than a frame from a rank."""
MAX_NOTE_BYTES: Final = 64 * 1024


class RecordingError(ValueError):
    """A file that is not a dagtop recording (wrong magic), or a record that is absurdly large."""


class RecordingWriter:
    """Appends frames to a recording; every record is written whole at once, so a crash loses at most one.

    A write that fails (disk full, file too large, I/O error) raises OSError; the writer first cuts the file
    back to its last whole record where it can, so what was written before stays readable as it is.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._size = 0
        self.frames = 0
        self._write(MAGIC)

    def append(self, frame: RawFrame) -> None:
        self._write(_HEADER.pack(len(frame.payload), frame.received_ns) + frame.payload)
        self.frames += 1

    def note(self, note: Mapping[str, Any]) -> None:
        """Append the recorder's own note (a map of plain values); readers keep the last one of each kind."""
        payload: bytes = msgpack.packb(dict(note), use_bin_type=True)
        self._write(_HEADER.pack(len(payload), NOTE_NS) + payload)

    def _write(self, record: bytes) -> None:
        view, done = memoryview(record), 0
        try:
            while done < len(record):  # a regular file may take part of a write at the edge of a limit
                written = self._file.write(view[done:])
                if not written:
                    raise OSError(errno.EIO, "the write made no progress")
                done += written
        except OSError:
            if done:
                try:
                    os.ftruncate(self._file.fileno(), self._size)
                except OSError:
                    pass  # a vanished disk: the reader skips the cut-short tail instead
            raise
        self._size += len(record)

    def close(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:
                pass  # nothing is buffered: every record was written, or reported failed, already

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingReader:
    """Reads a recording front to back; ``truncated`` tells whether the tail was cut short."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.truncated = False
        self.notes: dict[str, dict[str, Any]] = {}
        """The recorder's notes by kind (their ``k``), the last of each; filled as the recording is read."""
        with open(self.path, "rb") as f:
            magic = f.read(len(MAGIC))
        if magic != MAGIC:
            raise RecordingError(f"{self.path} is not a dagtop recording (bad magic {magic!r})")

    def __iter__(self) -> Iterator[RawFrame]:
        with open(self.path, "rb") as f:
            f.seek(len(MAGIC))
            while True:
                header = f.read(_HEADER.size)
                if not header:
                    return
                if len(header) < _HEADER.size:
                    self.truncated = True
                    return
                length, received_ns = _HEADER.unpack(header)
                if length > MAX_RECORD_BYTES:
                    raise RecordingError(f"{self.path}: record of {length} bytes at offset {f.tell()} is corrupt")
                payload = f.read(length)
                if len(payload) < length:
                    self.truncated = True
                    return
                if received_ns == NOTE_NS:
                    self._keep_note(payload)
                    continue
                yield RawFrame(received_ns, payload)

    def _keep_note(self, payload: bytes) -> None:
        try:
            note = msgpack.unpackb(payload, raw=False, max_bin_len=0, max_ext_len=0, max_str_len=MAX_NOTE_BYTES)
        except Exception:  # noqa: BLE001 - a note is a courtesy: one that does not read is skipped
            return
        if isinstance(note, dict) and isinstance(note.get("k"), str):
            self.notes[note["k"]] = note


def read_recording(path: str | os.PathLike[str]) -> list[RawFrame]:
    """All complete frames of a recording (a cut tail is skipped)."""
    return list(RecordingReader(path))


def read_notes(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The recorder's notes of a recording by kind, the last of each, reading only the records' headers besides."""
    reader = RecordingReader(path)
    with open(reader.path, "rb") as f:
        f.seek(len(MAGIC))
        while len(header := f.read(_HEADER.size)) == _HEADER.size:
            length, received_ns = _HEADER.unpack(header)
            if received_ns != NOTE_NS:
                f.seek(length, os.SEEK_CUR)
            elif length <= MAX_NOTE_BYTES and len(payload := f.read(length)) == length:
                reader._keep_note(payload)
    return reader.notes
