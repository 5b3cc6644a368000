"""Who may publish: ZeroMQ's own CURVE key pairs (``dagtop keygen``) and the monitor side of the handshake.

``dagtop keygen DIR`` writes two key pairs made by :func:`zmq.curve_keypair`, in ZeroMQ's certificate format: the
monitor's (``monitor.key``, ``monitor.key_secret``) and the ranks' (``rank.key``, ``rank.key_secret``). A secret key
file is created owner-only (0600) by the call that creates it, whatever the umask, so no other user can open it at
any moment, and never over an existing file. The monitor reads
``monitor.key_secret`` and ``rank.key``; a rank reads ``rank.key_secret`` and ``monitor.key``
(instrument/publisher.py, ``DAGTOP_AUTH=DIR``). With ``--auth DIR`` the monitor's socket is a CURVE server and a
ZAP handler (:class:`zmq.auth.thread.ThreadAuthenticator`) lets in only clients holding the rank key: traffic is
encrypted, and a rank without the key, or with another, never gets a frame through. What it does not do: tell
ranks apart (every rank holds the one rank key, so its holder can publish as any rank of the job; README says so).
Key files are checked when read (:mod:`instrument.keys`): a damaged one is one line naming it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import stat
import sys
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from dagtop.exits import Exit
from instrument.keys import MONITOR, RANK, KeyFileError, exposed, key_file, read_key_file


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
    """Write the monitor's and the ranks' key pairs in ``directory`` (made owner-only if missing); the files.

    Raises:
        AuthError: no CURVE, a directory any user may write in (another could swap the keys), or one that
            already holds keys (never overwritten: ranks may be using them).
    """
    require_curve()
    where = Path(directory)
    existing = [p.name for p in (where / key_file(n, s) for n in (MONITOR, RANK) for s in (False, True)) if p.exists()]
    if existing:
        raise AuthError(f"{where} already holds {', '.join(existing)}; remove them or name another directory")
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if stat.S_IMODE(where.stat().st_mode) & 0o002:
            raise AuthError(f"{where} is writable by every user, who could swap the keys; name a directory of your "
                            f"own (keygen makes it owner-only), e.g. {where / 'dagtop-keys'}")
        files: list[Path] = []
        for name in (MONITOR, RANK):
            public, secret = zmq.curve_keypair()
            files.append(_write_key_file(where / key_file(name, secret=False), public))
            files.append(_write_key_file(where / key_file(name, secret=True), public, secret))
    except FileExistsError as exc:
        raise AuthError(f"{where} already holds {Path(exc.filename).name}; remove it or name another directory") from None
    except OSError as exc:
        raise AuthError(f"cannot write keys in {where}: {exc.strerror or exc}") from None
    return files


_BANNER = """#   ****  Generated on {now:%Y-%m-%d %H:%M:%S} by dagtop keygen  ****
#   ZeroMQ CURVE {what} Certificate
#   {advice}

"""


def _write_key_file(path: Path, public: bytes, secret: bytes | None = None) -> Path:
    """One key file in ZeroMQ's certificate format (what :func:`zmq.auth.load_certificate` reads). Created by the
    open call itself with its final mode (never over an existing file): a secret is 0600 from its first byte, not
    written world-readable and then narrowed (``zmq.auth.create_certificates``), and a umask can only narrow that."""
    text = _BANNER.format(now=datetime.datetime.now(),
                          what="**Secret**" if secret else "Public",
                          advice=("DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions." if secret
                                  else "Exchange securely, or use a secure mechanism to verify the contents"))
    text += f'metadata\ncurve\n    public-key = "{public.decode()}"\n'
    if secret:
        text += f'    secret-key = "{secret.decode()}"\n'
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _load(directory: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    path = directory / key_file(name, secret)
    if not path.is_file():
        raise AuthError(f"{directory}: no {path.name} (make the keys with `dagtop keygen {directory}`)")
    try:
        public, private = read_key_file(path, secret)
    except KeyFileError as exc:
        raise AuthError(str(exc)) from None
    if secret and (said := exposed(path)) is not None:
        print(f"dagtop: warning: {said}", file=sys.stderr)
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
