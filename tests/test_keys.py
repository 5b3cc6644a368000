"""Key files: ``dagtop keygen`` creates each secret owner-only from its first byte whatever the umask, refuses a
directory anyone may write in; a damaged key file is one line naming it on the monitor (exit 2) and on a rank
(one warning, training goes on untimed); a secret open to other users is warned about on both sides."""

from __future__ import annotations

import builtins
import os
import pwd
import re
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from dagtop.commands.cli import main
from dagtop.exits import Exit
from instrument.keys import KeyFileError, check_auth, read_key_file


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_keygen_creates_each_secret_owner_only_from_its_first_byte_under_umask_000(
        tmp_path: Path, umask_000: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file keygen creates is looked at the instant it exists, before a byte is written: the secrets are
    0600 then, so no other user can open one at any moment (what ``chmod`` after writing cannot promise)."""
    seen: dict[str, int] = {}
    real_os_open, real_open = os.open, builtins.open

    def os_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        existed = os.path.exists(path)
        fd = real_os_open(path, flags, mode, *args, **kwargs)
        if not existed:
            seen[Path(path).name] = stat.S_IMODE(os.fstat(fd).st_mode)
        return fd

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        existed = isinstance(file, (str, os.PathLike)) and os.path.exists(file)
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and not existed and any(c in mode for c in "wax"):
            seen[Path(file).name] = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        return f

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    keys = tmp_path / "keys"
    assert main(["keygen", str(keys)]) == 0
    monkeypatch.undo()
    assert seen == {"monitor.key": 0o644, "monitor.key_secret": 0o600, "rank.key": 0o644, "rank.key_secret": 0o600}
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    for name in ("monitor", "rank"):  # what zmq reads, and a pair that goes together
        public, secret = read_key_file(keys / f"{name}.key_secret", secret=True)
        assert secret is not None and zmq.curve_public(secret) == public
        assert read_key_file(keys / f"{name}.key", secret=False) == (public, None)


READER = """
import ctypes, os, struct, sys, time
directory, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
libc.inotify_add_watch(fd, directory.encode(), 0x100)  # IN_CREATE: each file the moment it exists
os.setgid(gid)
os.setuid(uid)
print("ready", flush=True)
read, seen = set(), 0
os.set_blocking(fd, False)
end = time.monotonic() + 60
while time.monotonic() < end and seen < 4:
    try:
        data = os.read(fd, 4096)
    except BlockingIOError:
        continue
    while data:
        _, _, _, size = struct.unpack_from("iIII", data)
        name = data[16:16 + size].rstrip(bytes(1)).decode()
        data = data[16 + size:]
        seen += 1
        for _ in range(2000 if name.endswith("_secret") else 0):  # opened at once, as often as it takes
            try:
                f = open(os.path.join(directory, name))
            except OSError:
                break
            with f:  # an open file stays readable whatever its mode becomes: read it until its key is written
                for _ in range(2000):
                    f.seek(0)
                    if "secret-key" in f.read():
                        read.add(name)
                        break
            break
for name in os.listdir(directory):  # and every file once more at the end: the public keys show it could read
    try:
        with open(os.path.join(directory, name)) as f:
            if "-key" in f.read():
                read.add(name)
    except OSError:
        pass
print(" ".join(sorted(read)), flush=True)
"""
"""User ``nobody`` watching a directory (inotify): opens each secret key file the instant it is created and, if the
open is allowed, reads it until its key is written; then tries every file once more; prints the names it read."""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to read as user nobody")
def test_under_umask_000_no_other_user_reads_a_secret_at_any_moment(capsys: pytest.CaptureFixture[str]) -> None:
    """A real ``dagtop keygen`` under umask 000 into a directory others may enter, while user ``nobody`` opens
    every file the instant it exists: the public keys are read (the reader could), the secrets never."""
    nobody = pwd.getpwnam("nobody")
    with tempfile.TemporaryDirectory(prefix="dagtop-keys-") as where:
        keys = Path(where)
        keys.chmod(0o755)  # others may enter, as a home directory or a shared checkout
        reader = subprocess.Popen([sys.executable, "-c", READER, str(keys), str(nobody.pw_uid), str(nobody.pw_gid)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
            made = subprocess.run(["sh", "-c", 'umask 000 && exec "$0" -m dagtop keygen "$1"', sys.executable,
                                   str(keys)], capture_output=True, text=True, timeout=120)
            assert made.returncode == 0, made.stderr
            out, _ = reader.communicate(timeout=120)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
        assert out.split() == ["monitor.key", "rank.key"], out
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in keys.iterdir()} == {
            "monitor.key": 0o644, "monitor.key_secret": 0o600, "rank.key": 0o644, "rank.key_secret": 0o600}


def test_keygen_refuses_a_directory_every_user_may_write_in(tmp_path: Path, umask_000: None,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    assert main(["keygen", str(shared)]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by every user" in err and list(shared.iterdir()) == []


def _damaged() -> Iterator[tuple[str, str, str]]:
    """(what, file, how): each way a key file can be damaged, applied by :func:`_damage`."""
    yield "a key cut short", "key_secret", "cut"
    yield "junk bytes", "key_secret", "junk"
    yield "no secret key line", "key_secret", "no secret"
    yield "a secret of another pair", "key_secret", "mixed"
    yield "an empty file", "key_secret", "empty"


def _damage(path: Path, how: str, other: Path) -> None:
    text = path.read_text()
    if how == "cut":
        path.write_text(re.sub(r'secret-key = "([^"]{30})[^"]*"', r'secret-key = "\1"', text))  # 30 of 40
    elif how == "junk":
        path.write_bytes(os.urandom(300))
    elif how == "no secret":
        path.write_text("\n".join(line for line in text.splitlines() if "secret-key" not in line) + "\n")
    elif how == "mixed":
        theirs = next(line for line in other.read_text().splitlines() if "secret-key" in line)
        path.write_text("\n".join(theirs if "secret-key" in line else line for line in text.splitlines()) + "\n")
    elif how == "empty":
        path.write_text("")


@pytest.mark.parametrize("what,suffix,how", list(_damaged()))
def test_a_damaged_monitor_key_is_one_line_naming_it(tmp_path: Path, endpoint: str, what: str, suffix: str,
                                                     how: str, capsys: pytest.CaptureFixture[str]) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    assert main(["keygen", str(keys)]) == 0 and main(["keygen", str(other)]) == 0
    _damage(keys / f"monitor.{suffix}", how, other / f"monitor.{suffix}")
    capsys.readouterr()
    status = main(["record", "--bind", endpoint, "-o", str(tmp_path / "r.dagtop"), "--auth", str(keys)])
    err = capsys.readouterr().err
    assert status == Exit.BAD_INPUT and err.count("\n") == 1, err
    assert f"{keys / 'monitor.key_secret'}: " in err and "Traceback" not in err, err


def test_each_damage_is_said_for_what_it_is(tmp_path: Path) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    assert main(["keygen", str(keys)]) == 0 and main(["keygen", str(other)]) == 0
    said = {}
    for _, suffix, how in _damaged():
        path = tmp_path / f"{how}.key_secret"
        path.write_bytes((keys / f"rank.{suffix}").read_bytes())
        _damage(path, how, other / f"rank.{suffix}")
        with pytest.raises(KeyFileError) as caught:
            read_key_file(path, secret=True)
        said[how] = str(caught.value).split(": ", 1)[1]
    assert said["cut"].startswith("the secret key is not a CURVE key")
    assert said["junk"] == said["empty"] == "not a key file (no public-key line)"
    assert said["no secret"] == "holds no secret key"
    assert said["mixed"].startswith("its secret key does not go with its public key")


RANK = """
import warnings, torch
warnings.simplefilter("default")
import instrument
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
tracer = instrument.attach(model, opt)
for _ in range(3):
    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
print("trained", type(tracer).__name__)
"""


def test_a_rank_with_a_damaged_key_says_which_in_one_warning_and_trains_on_untimed(tmp_path: Path,
                                                                                   endpoint: str) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    assert main(["keygen", str(keys)]) == 0 and main(["keygen", str(other)]) == 0
    _damage(keys / "rank.key_secret", "cut", other / "rank.key_secret")
    env = {**os.environ, "DAGTOP_AUTH": str(keys), "DAGTOP_ENDPOINT": endpoint, "DAGTOP_TELEMETRY": "0"}
    env.pop("DAGTOP_DISABLE", None)
    run = subprocess.run([sys.executable, "-c", RANK], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "trained NullTracer", run.stderr
    warned = [line for line in run.stderr.splitlines() if "dagtop:" in line]
    assert len(warned) == 1 and f"{keys / 'rank.key_secret'}: the secret key is not a CURVE key" in warned[0]
    assert "training continues untimed" in warned[0] and "ZMQError" not in run.stderr


def test_a_secret_open_to_others_is_warned_about_on_both_sides(tmp_path: Path, endpoint: str,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    assert main(["keygen", str(keys)]) == 0
    for name in ("monitor", "rank"):
        (keys / f"{name}.key_secret").chmod(0o644)
    monkeypatch.setenv("DAGTOP_AUTH", str(keys))
    with pytest.warns(RuntimeWarning, match=r"rank\.key_secret is open to other users \(mode 0644\)"):
        assert check_auth() is None  # usable: warned, not refused
    capsys.readouterr()
    status = main(["record", "--bind", endpoint, "-o", str(tmp_path / "r.dagtop"), "--auth", str(keys),
                   "--timeout", "0.2"])
    err = capsys.readouterr().err
    assert status == Exit.TIMEOUT
    assert f"dagtop: warning: {keys / 'monitor.key_secret'} is open to other users (mode 0644)" in err
