"""A command's output file written whole or not at all: a temporary file beside it, renamed over it once complete.

``dagtop export`` and ``dagtop import`` write a file the user then opens elsewhere (Perfetto, ``dagtop report``):
a file cut short by a full disk or ``ulimit -f`` would be invalid JSON or a recording missing its end, with
nothing to say so. So they write beside the target and rename only a file whose every write succeeded; on a
failure the temporary file is removed, the target (new or older) is left as it was, and the command says why
in one line. A target that is not a regular file (``/dev/null``, ``/dev/stdout``, a pipe) is written in place:
renaming over a device would replace it.

``dagtop record`` is different on purpose: it appends as frames come, so that a recorder killed mid-run keeps
what it had (dagtop/io/recording.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path


class OutputError(Exception):
    """The output could not be written; the message is one line that names the file and the reason."""


def why(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """The reason an OSError gives, in the system's words, without Python's ``[Errno N]``; for a file that could
    not be created in a folder that exists (``/proc``), that the folder takes no new files."""
    if exc.errno == errno.ENOENT and path is not None and Path(path).parent.is_dir() and not Path(path).exists():
        return f"{Path(path).parent} takes no new files"
    return os.strerror(exc.errno) if exc.errno else str(exc)


@contextlib.contextmanager
def whole_file(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yields the path to write the output to; once the block ends without error it is ``target``, whole.

    Raises:
        OutputError: the output could not be written (the block's OSError, or the rename's): nothing of it is left.
    """
    path = Path(target)
    try:
        in_place = path.exists() and not stat.S_ISREG(path.stat().st_mode)
    except OSError:
        in_place = False
    if in_place:
        try:
            yield path
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {why(exc)}") from None
        return
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        # Created here, with the mode open() would give the target (0666 less the umask), so that the rename
        # leaves what a plain write would have.
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {why(exc, path)}") from None
    try:
        yield temporary
        with open(temporary, "rb") as written:  # the data on the disk before the name: a crash leaves no half file
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {why(exc)}; nothing written") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
