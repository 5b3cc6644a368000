"""CURVE key files as ``dagtop keygen`` writes them: read and checked alike by a rank and by the monitor.

A key file is ZeroMQ's certificate format (``zmq.auth``): ``public-key = "…"`` and, in a ``*.key_secret`` file,
``secret-key = "…"``, each 40 characters of Z85 (32 bytes). Everything that can be wrong with one is said in one
line that names the file (:class:`KeyFileError`), instead of the ``Invalid argument`` libzmq gives a bad key
later; a secret others may read is said too (:func:`exposed`), as ssh does. A rank's keys (``DAGTOP_AUTH``) are
checked when it attaches (:func:`check_auth`), so that one unusable is said before anything is timed.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Final

import zmq
import zmq.auth

from instrument import settings

KEY_CHARS: Final = 40
"""A CURVE key in Z85: 32 bytes, five characters for every four."""
_Z85: Final = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
MONITOR: Final = "monitor"
RANK: Final = "rank"
"""The two key pairs of a ``dagtop keygen`` directory: the monitor's, and the one every rank holds."""


def key_file(holder: str, secret: bool) -> str:
    """The name of a holder's public key file (``rank.key``) or secret key file (``rank.key_secret``)."""
    return f"{holder}.key_secret" if secret else f"{holder}.key"


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names it and says what is wrong, in one line."""


def read_key_file(path: str | os.PathLike[str], secret: bool) -> tuple[bytes, bytes | None]:
    """(public key, secret key) of a key file, both checked; the secret is None unless ``secret``.

    Raises:
        KeyFileError: missing, unreadable, not a key file, a key that is not a CURVE key, no secret key where
            one is needed, or a secret key that does not go with the file's public key.
    """
    where = Path(path)
    if not where.exists():
        raise KeyFileError(f"{where}: no such file")
    try:
        public, private = zmq.auth.load_certificate(where)
    except ValueError:
        raise KeyFileError(f"{where}: not a key file (no public-key line)") from None
    except OSError as exc:
        raise KeyFileError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    _check(where, "public", public)
    if not secret:
        return public, None
    if not private:
        raise KeyFileError(f"{where}: holds no secret key")
    _check(where, "secret", private)
    if zmq.curve_public(private) != public:
        raise KeyFileError(f"{where}: its secret key does not go with its public key (the file was edited or mixed)")
    return public, private


def _check(where: Path, which: str, key: bytes) -> None:
    if len(key) != KEY_CHARS or not _Z85.issuperset(key):
        raise KeyFileError(f"{where}: the {which} key is not a CURVE key ({len(key)} characters; one is "
                           f"{KEY_CHARS} characters of Z85): the file is damaged, make new keys with `dagtop keygen`")


def exposed(path: str | os.PathLike[str]) -> str | None:
    """A warning if the secret key file ``path`` may be read or written by users other than its owner, as ssh warns
    of a private key; None if it is the owner's alone (or cannot be looked at)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"{path} is open to other users (mode {mode:04o}): whoever reads it can publish to the monitor; "
            f"`chmod 600 {path}`")


def curve_keys(directory: str) -> tuple[bytes, bytes, bytes]:
    """(public, secret, server public) from a ``dagtop keygen`` directory.

    Raises:
        RuntimeError: no CURVE in this libzmq, or a key missing, unreadable or damaged; one line that names the
            file and says what is wrong.
    """
    if not zmq.has("curve"):
        raise RuntimeError(f"{settings.AUTH}={directory}: this libzmq was built without CURVE")
    where = Path(directory)
    try:
        public, secret = read_key_file(where / key_file(RANK, secret=True), secret=True)
        server, _ = read_key_file(where / key_file(MONITOR, secret=False), secret=False)
    except KeyFileError as exc:
        raise RuntimeError(f"{settings.AUTH}={directory}: {exc}; make the keys with `dagtop keygen DIR`") from None
    assert secret is not None
    return public, secret, server


def check_auth() -> str | None:
    """Before a rank starts publishing: why its ``DAGTOP_AUTH`` keys cannot be used (one line), or None (also
    without ``DAGTOP_AUTH``). A secret key other users may read is warned about, once."""
    directory = settings.read().auth
    if not directory:
        return None
    try:
        curve_keys(directory)
    except RuntimeError as exc:
        return str(exc)
    if (said := exposed(Path(directory) / key_file(RANK, secret=True))) is not None:
        warnings.warn(f"dagtop: {said}", RuntimeWarning, stacklevel=3)
    return None
