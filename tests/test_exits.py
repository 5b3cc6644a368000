"""Exit statuses have one home (:class:`dagtop.exits.Exit`), and binding the monitor's socket one behaviour: an
endpoint in use is refused in one line by every command, and the demo binds a port ZeroMQ picks before its ranks
are told it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import zmq

from dagtop.commands.cli import main
from dagtop.demo import launch
from dagtop.exits import Exit, table
from dagtop.io.sources import ANY_LOCAL_PORT, BindError, ZmqSource


def test_the_table_names_every_status_with_its_number() -> None:
    assert sorted((name, number) for number, name, _ in table()) == sorted(
        (name, int(member)) for name, member in Exit.__members__.items())


def test_the_numbers_scripts_rely_on() -> None:
    assert (Exit.OK, Exit.SHORT, Exit.USAGE, Exit.ORPHANED, Exit.INTERRUPTED, Exit.BROKEN_PIPE) == (0, 1, 2, 3, 130, 141)
    assert Exit.TIMEOUT == Exit.CANNOT_BIND == Exit.BAD_INPUT == 2


def test_help_ends_with_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    epilog = capsys.readouterr().out.split("exit status:", 1)[1]
    flat = " ".join(epilog.split())
    for number, _, meaning in table():
        assert re.search(rf"^{number} ", epilog, flags=re.MULTILINE), number
        assert " ".join(meaning.split()) in flat


@pytest.fixture
def taken() -> Any:
    """An endpoint another monitor holds."""
    source = ZmqSource(ANY_LOCAL_PORT)
    yield source.endpoint
    source.close()


@pytest.mark.parametrize(("argv", "status", "prefix"), [
    (["--bind", "{endpoint}"], Exit.CANNOT_BIND, "dagtop: "),
    (["record", "--bind", "{endpoint}", "-o", "{output}", "--timeout", "1"], Exit.CANNOT_BIND, "dagtop record: "),
    (["demo", "--bind", "{endpoint}", "--record", "{output}", "--iterations", "1"], Exit.CANNOT_BIND, "dagtop demo: "),
], ids=["live", "record", "demo"])
def test_an_endpoint_in_use_is_refused_in_one_line(argv: list[str], status: int, prefix: str, taken: str,
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "x.dagtop"
    assert main([a.format(endpoint=taken, output=output) for a in argv]) == status
    err = capsys.readouterr().err
    assert err == f"{prefix}cannot bind {taken}: Address already in use (is another dagtop running? try --bind)\n"
    assert not output.exists()


def test_an_address_of_another_machine_is_refused_without_the_hint() -> None:
    with pytest.raises(BindError, match=r"^cannot bind tcp://192\.0\.2\.1:5555: [^(]+$"):
        ZmqSource("tcp://192.0.2.1:5555")  # TEST-NET-1: never an address of this machine


def test_a_source_on_any_port_names_the_port_it_bound_and_receives_there() -> None:
    source = ZmqSource(ANY_LOCAL_PORT)
    try:
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", source.endpoint) and not source.endpoint.endswith(":0")
        with pytest.raises(BindError):
            ZmqSource(source.endpoint)
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.connect(source.endpoint)
        try:
            frames = []
            for _ in range(100):  # a PUB drops what it sends before the connection is up
                pub.send(b"hello")
                frames += source.poll(0.05)
                if frames:
                    break
            assert frames and frames[0].payload == b"hello"
        finally:
            pub.close(linger=0)
    finally:
        source.close()


def test_the_demo_tells_its_ranks_the_port_it_holds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, str] = {}

    def fake_record_demo(job: launch.DemoJob, path: str, iterations: int, progress: Any = None,
                         source: ZmqSource | None = None) -> int:
        assert source is not None
        seen.update(job=job.endpoint, source=source.endpoint)
        with pytest.raises(BindError):  # held while the ranks would start: nobody can take it in between
            ZmqSource(job.endpoint)
        source.close()
        return Exit.OK

    monkeypatch.setattr(launch, "record_demo", fake_record_demo)
    args = argparse.Namespace(ranks=2, bottleneck="none", straggler=None, iterations=1, record=str(tmp_path / "x"),
                              bind=None, device="cpu", granularity="block")
    assert launch.run_demo(args) == Exit.OK
    assert seen["job"] == seen["source"] and re.fullmatch(r"tcp://127\.0\.0\.1:\d+", seen["job"])
