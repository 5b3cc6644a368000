"""Crash-safe recordings: length-prefixed wire frames, appended as they arrive.

Layout: an 8-byte magic ``DAGTOP\\x00\\x01``, then records of ``<u32 length><u64 received_ns>``
followed by ``length`` bytes of one wire frame exactly as it came off the socket. A writer
flushes every record, so a monitor killed mid-run leaves a file whose complete records all
read back; a record cut short at the tail is reported and skipped, never raised.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

if TYPE_CHECKING:
    from typing_extensions import Self

MAGIC: Final = b"DAGTOP\x00\x01"
_HEADER: Final = struct.Struct("<IQ")
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024


class RecordingError(ValueError):
    """A file that is not a dagtop recording (wrong magic), or a record that is absurdly large."""


@dataclass(frozen=True, slots=True)
class RawFrame:
    """One frame as received: the bytes and the monitor's monotonic receive time."""

    received_ns: int
    payload: bytes


class RecordingWriter:
    """Appends frames to a recording; every record is flushed so a crash loses at most one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._file.write(MAGIC)
        self._file.flush()
        self.frames = 0

    def append(self, frame: RawFrame) -> None:
        self._file.write(_HEADER.pack(len(frame.payload), frame.received_ns))
        self._file.write(frame.payload)
        self._file.flush()
        self.frames += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingReader:
    """Reads a recording front to back; ``truncated`` tells whether the tail was cut short."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.truncated = False
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
                yield RawFrame(received_ns, payload)


def read_recording(path: str | os.PathLike[str]) -> list[RawFrame]:
    """All complete frames of a recording (a cut tail is skipped)."""
    return list(RecordingReader(path))
