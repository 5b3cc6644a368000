"""Who may publish: ZeroMQ's own CURVE key pairs (``dagtop keygen``) and the monitor side of the handshake.

``dagtop keygen DIR`` writes two key pairs with :func:`zmq.auth.create_certificates`: the monitor's
(``monitor.key``, ``monitor.key_secret``) and the ranks' (``rank.key``, ``rank.key_secret``). The monitor reads
``monitor.key_secret`` and ``rank.key``; a rank reads ``rank.key_secret`` and ``monitor.key``
(instrument/publisher.py, ``DAGTOP_AUTH=DIR``). With ``--auth DIR`` the monitor's socket is a CURVE server and a
ZAP handler (:class:`zmq.auth.thread.ThreadAuthenticator`) lets in only clients holding the rank key: traffic is
encrypted, and a rank without the key, or with another, never gets a frame through.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from dagtop.exits import Exit

MONITOR = "monitor"
RANK = "rank"


class AuthError(Exception):
    """Keys that cannot be used, or a libzmq without CURVE; the message is the one line to tell the user."""

    def __init__(self, message: str, code: int = Exit.BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code
        """The exit status to end with."""


def require_curve() -> None:
    """Raises AuthError where libzmq was built without CURVE (libsodium or tweetnacl)."""
    if not zmq.has("curve"):
        raise AuthError(code=Exit.NO_CURVE, message=f"this libzmq ({zmq.zmq_version()}) was built without CURVE; install a pyzmq wheel "
                        "(it bundles a libzmq with CURVE) or build libzmq with libsodium")


def monitor_auth(directory: str | None) -> MonitorAuth | None:
    """The monitor's side of ``--auth DIR``; None without it.

    Raises:
        AuthError: no CURVE, or the keys cannot be read.
    """
    return None if directory is None else MonitorAuth(directory)


def keygen(directory: str | os.PathLike[str]) -> list[Path]:
    """Write the monitor's and the ranks' key pairs in ``directory`` (made if missing, owner-only); the files.

    Raises:
        AuthError: no CURVE, or the directory already holds keys (never overwritten: ranks may be using them).
    """
    require_curve()
    where = Path(directory)
    existing = [p.name for p in (where / f"{n}.{ext}" for n in (MONITOR, RANK) for ext in ("key", "key_secret"))
                if p.exists()]
    if existing:
        raise AuthError(f"{where} already holds {', '.join(existing)}; remove them or name another directory")
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        files: list[Path] = []
        for name in (MONITOR, RANK):
            public, secret = zmq.auth.create_certificates(where, name)
            os.chmod(secret, 0o600)
            files += [Path(public), Path(secret)]
    except OSError as exc:
        raise AuthError(f"cannot write keys in {where}: {exc.strerror or exc}") from None
    return files


def _load(directory: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    path = directory / f"{name}.key{'_secret' if secret else ''}"
    if not path.is_file():
        raise AuthError(f"{directory}: no {path.name} (make the keys with `dagtop keygen {directory}`)")
    try:
        public, private = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise AuthError(f"{path}: not a key file ({exc})") from None
    if secret and not private:
        raise AuthError(f"{path}: holds no secret key")
    return public, private


class _RankKeys:
    """The ZAP handler's question, for CURVE: is this client's public key the ranks' key?"""

    def __init__(self, allowed: bytes) -> None:
        self._allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self._allowed


class MonitorAuth:
    """The monitor's keys and the ranks' public key, read from a ``dagtop keygen`` directory.

    Raises:
        AuthError: no CURVE, or a key missing or unreadable.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        require_curve()
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise AuthError(f"{self.directory}: no such directory (make the keys with `dagtop keygen DIR`)")
        self.public, self.secret = _load(self.directory, MONITOR, secret=True)
        self.rank_public, _ = _load(self.directory, RANK, secret=False)
        self._authenticator: ThreadAuthenticator | None = None

    def serve(self, socket: zmq.Socket[bytes]) -> None:
        """Make ``socket`` (not bound yet) a CURVE server that lets in only the rank key. Starts the ZAP handler,
        one per context: give each authenticated socket a context of its own."""
        self._authenticator = ThreadAuthenticator(socket.context)
        self._authenticator.start()
        self._authenticator.configure_curve_callback("*", _RankKeys(self.rank_public))
        socket.curve_server = True
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret or b""

    def close(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None


def run_keygen(args: argparse.Namespace) -> int:
    """``dagtop keygen DIR``: write the key pairs, say which file goes where."""
    try:
        files = keygen(args.directory)
    except AuthError as exc:
        print(f"dagtop keygen: {exc}", file=sys.stderr)
        return exc.code
    where = Path(args.directory)
    print(f"dagtop keygen: wrote {', '.join(f.name for f in files)} in {where}\n"
          f"  monitor:  dagtop --auth {where} (reads monitor.key_secret, rank.key)\n"
          f"  ranks:    DAGTOP_AUTH={where} (reads rank.key_secret, monitor.key: copy just these two to the nodes)")
    return Exit.OK
