"""Bad command lines get one clear error and exit 2, before anything binds, spawns or writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagtop.commands.cli import main


@pytest.mark.parametrize(("argv", "says"), [
    (["record", "-o", "/nonexistent/x.dagtop"], "/nonexistent does not exist"),
    (["record", "-o", "/tmp"], "/tmp is a directory"),
    (["demo", "--record", "/nonexistent/y"], "/nonexistent does not exist"),
    (["--bind", "foo"], "not an endpoint: 'foo'"),
    (["record", "--bind", "tcp://127.0.0.1:99999", "-o", "x.dagtop"], "PORT from 1 to 65535"),
    (["demo", "--ranks", "0"], "must be at least 1"),
    (["--ranks", "-3"], "must be at least 1"),
    (["record", "-o", "x.dagtop", "--iterations", "0"], "must be at least 1"),
    (["replay", "run.dagtop", "--speed", "-1"], "must be 0 (as fast as possible) or more"),
    # Issue #30: what is wrong, not what the OS made of it ("No such device"), nor an empty range.
    (["--bind", "tcp://999.1.1.1:5555"], "999.1.1.1 is not an IPv4 address"),
    (["record", "--bind", "tcp://10.0.0.256:5555", "-o", "x.dagtop"], "10.0.0.256 is not an IPv4 address"),
    (["report", "run.dagtop", "--iterations", "5:2"], ("5:2 is reversed: A:B is iterations A to B-1, A below B "
                                                      "(did you mean 2:5?)")),
    (["report", "run.dagtop", "--iterations", "5:5"], "5:5 is empty"),
])
def test_a_bad_argument_is_refused_in_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not os.listdir(tmp_path)  # nothing written


def test_an_unwritable_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root writes anywhere: nothing to check here
        pytest.skip("running as root")
    with pytest.raises(SystemExit):
        main(["record", "-o", str(locked / "x.dagtop")])
    assert "is not writable" in capsys.readouterr().err


def test_a_straggler_without_a_bottleneck_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--straggler", "1", "--iterations", "2", "--record", os.devnull]) == 2
    assert "--straggler needs --bottleneck" in capsys.readouterr().err


def test_report_on_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "is a directory, not a recording" in capsys.readouterr().err


def test_a_host_that_names_no_address_here_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ZeroMQ takes a host it cannot resolve as the name of a network interface: "No such device" said nothing."""
    assert main(["record", "--bind", "tcp://no-such-interface:5555", "-o", str(tmp_path / "x.dagtop"),
                 "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no address or network interface of this machine has that name" in err
    assert "No such device" not in err
