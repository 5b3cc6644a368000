"""``dagtop export`` and ``dagtop import`` on an output that cannot be written (a full device, ``ulimit -f``, a
folder that takes no files): one line, exit status 4 as ``record`` says it, and no file cut short left behind."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from test_import import _write, nccl_rank

from dagtop.commands.cli import main
from dagtop.exits import Exit
from dagtop.io.output import OutputError, whole_file
from dagtop.io.recording import read_recording

FIXTURE = Path(__file__).parent.parent / "dagtop" / "fixtures" / "demo-allreduce.dagtop"


def _dagtop(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own, its file size limited to ``fsize`` bytes (``ulimit -f``) if given."""
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "dagtop", *args], capture_output=True, text=True,
                          preexec_fn=limit, timeout=300)


def _one_line(err: str, command: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dagtop {command}: cannot write"), err
    return lines[0]


def _traces(tmp_path: Path) -> list[str]:
    return [_write(tmp_path, f"r{r}.json", nccl_rank(r, 2000.0 * r)) for r in (0, 1)]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["export", "import"])
def test_a_full_device_is_one_line_and_exit_4(tmp_path: Path, command: str) -> None:
    inputs = [str(FIXTURE)] if command == "export" else _traces(tmp_path)
    done = _dagtop(command, *inputs, "-o", "/dev/full")
    assert done.returncode == Exit.DISK == 4
    assert os.strerror(errno.ENOSPC) in _one_line(done.stderr, command)


@pytest.mark.parametrize("command", ["export", "import"])
def test_past_the_file_size_limit_nothing_cut_short_is_left(tmp_path: Path, command: str) -> None:
    """A file under ``ulimit -f`` fails part way; the target must not be left holding the part (invalid JSON, a
    recording without its end), and an older file of that name stays as it was."""
    inputs = [str(FIXTURE)] if command == "export" else _traces(tmp_path)
    whole = tmp_path / "whole.out"
    assert _dagtop(command, *inputs, "-o", str(whole)).returncode == 0
    size = whole.stat().st_size
    assert size > 200
    out = tmp_path / "out" / "run.out"
    out.parent.mkdir()
    done = _dagtop(command, *inputs, "-o", str(out), fsize=size // 2)
    assert done.returncode == Exit.DISK
    assert os.strerror(errno.EFBIG) in _one_line(done.stderr, command)
    assert list(out.parent.iterdir()) == []  # neither the target nor a temporary file
    out.write_text("an older file")
    assert _dagtop(command, *inputs, "-o", str(out), fsize=size // 2).returncode == Exit.DISK
    assert out.read_text() == "an older file" and list(out.parent.iterdir()) == [out]
    assert _dagtop(command, *inputs, "-o", str(out)).returncode == 0  # and with room, the whole file
    if command == "export":
        assert json.loads(out.read_text())["traceEvents"]
    else:
        assert read_recording(out) == read_recording(whole)


@pytest.mark.parametrize("target", ["/proc/dagtop-test.json", "/sys/dagtop-test.json"])
@pytest.mark.parametrize("command", ["export", "import"])
def test_a_folder_that_takes_no_files_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  command: str, target: str) -> None:
    if not os.path.isdir(os.path.dirname(target)):
        pytest.skip(f"no {os.path.dirname(target)} here")
    inputs = [str(FIXTURE)] if command == "export" else _traces(tmp_path)
    capsys.readouterr()
    code = main([command, *inputs, "-o", target])
    err = capsys.readouterr().err
    assert not os.path.exists(target)
    if code == Exit.USAGE:  # not root: the folder is not writable, which the command line already says
        assert "not writable" in err and err.count("\n") == 1
    else:
        assert code == Exit.DISK
        _one_line(err, command)


def test_a_device_is_written_in_place_not_renamed_over(tmp_path: Path) -> None:
    with whole_file("/dev/null") as path:
        assert path == Path("/dev/null")
        path.write_text("gone")
    assert Path("/dev/null").exists() and not Path("/dev/null").is_file()


def test_an_error_in_the_block_removes_the_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    with pytest.raises(OutputError, match=f"cannot write {target}: No space left on device"), \
            whole_file(target) as path:
        path.write_text("part")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert list(tmp_path.iterdir()) == []


def test_the_file_gets_the_mode_a_plain_write_would(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        with whole_file(tmp_path / "t.json") as path:
            path.write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "t.json").stat().st_mode & 0o777 == 0o640
