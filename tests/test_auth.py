"""CURVE: `dagtop keygen` writes the key pairs, `dagtop record --auth DIR` records a rank holding the rank key and
refuses one without it (or with another), which warns once and trains on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from helpers.waits import WAIT_S

from dagtop.commands.cli import main
from dagtop.exits import Exit
from dagtop.io.recording import read_recording
from instrument import wire

RANK = """
import os, sys, time
from instrument import wire
from instrument.publisher import Publisher
rank, world, stop = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def hello(seq):
    return wire.Hello(seq, rank, world, rank, "h", os.getpid(), "cpu", "t", "M", 1, "block", 1, time.perf_counter_ns())
publisher = Publisher(os.environ["DAGTOP_ENDPOINT"], rank, hello, on_error=lambda exc: print("error", exc))
it, deadline = 0, time.monotonic() + 300
while not os.path.exists(stop) and time.monotonic() < deadline:
    now = time.perf_counter_ns()
    publisher.put_iteration(it, [("compute", "update", "optimizer.step", "main", now, now + 5, 0)])
    it += 1
    time.sleep(0.02)
publisher.close()
print("trained", it, "iterations")
"""
"""A rank: publishes an iteration every 20 ms until the stop file appears (its training loop, as far as dagtop
can tell), then says how many it ran."""


def _rank(rank: int, world: int, endpoint: str, stop: Path, log: Path, auth: Path | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DAGTOP_ENDPOINT": endpoint, "PYTHONWARNINGS": "default"}
    env.pop("DAGTOP_AUTH", None)
    if auth is not None:
        env["DAGTOP_AUTH"] = str(auth)
    with open(log, "wb") as sink:
        return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(world), str(stop)], env=env,
                                stdout=sink, stderr=subprocess.STDOUT)


def _wait_for(path: Path, text: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} not in {path.name}: {path.read_text(errors='replace')}"
        time.sleep(0.05)


def test_keygen_writes_both_pairs_and_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    assert main(["keygen", str(keys)]) == 0
    assert sorted(p.name for p in keys.iterdir()) == ["monitor.key", "monitor.key_secret", "rank.key",
                                                      "rank.key_secret"]
    assert (keys / "rank.key_secret").stat().st_mode & 0o077 == 0
    out = capsys.readouterr().out
    assert f"DAGTOP_AUTH={keys}" in out and f"--auth {keys}" in out
    before = (keys / "rank.key_secret").read_bytes()
    assert main(["keygen", str(keys)]) == Exit.BAD_INPUT
    assert "already holds" in capsys.readouterr().err and (keys / "rank.key_secret").read_bytes() == before


def test_no_curve_is_one_line(tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zmq, "has", lambda capability: False)
    assert main(["keygen", str(tmp_path / "k")]) == Exit.NO_CURVE
    assert main(["record", "--bind", endpoint, "-o", str(tmp_path / "r.dagtop"), "--auth", str(tmp_path)]) == 5
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("built without CURVE" in line for line in err)


def test_auth_with_missing_keys_is_one_line(tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["record", "--bind", endpoint, "-o", str(tmp_path / "r.dagtop"), "--auth", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == Exit.BAD_INPUT and err.count("\n") == 1 and "no monitor.key_secret" in err


@pytest.mark.slow
def test_record_with_auth_takes_the_keyed_rank_and_refuses_the_others(tmp_path: Path, endpoint: str) -> None:
    keys, other, wrong = tmp_path / "keys", tmp_path / "other", tmp_path / "wrong"
    assert main(["keygen", str(keys)]) == 0 and main(["keygen", str(other)]) == 0
    wrong.mkdir()  # the monitor's public key, right; a rank key of another keygen
    shutil.copy(keys / "monitor.key", wrong)
    shutil.copy(other / "rank.key_secret", wrong)
    stop, path = tmp_path / "stop", tmp_path / "r.dagtop"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o", str(path), "--auth", str(keys),
         "--iterations", "10", "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = {name: tmp_path / f"{name}.log" for name in ("keyed", "unkeyed", "wrong")}
    ranks = []
    try:
        # The two without the key first: once each has been refused, the monitor has counted it too.
        ranks.append(_rank(1, 2, endpoint, stop, logs["unkeyed"], None))
        ranks.append(_rank(1, 2, endpoint, stop, logs["wrong"], wrong))
        _wait_for(logs["unkeyed"], "refused rank 1")
        _wait_for(logs["wrong"], "refused rank 1")
        ranks.append(_rank(0, 1, endpoint, stop, logs["keyed"], keys))
        _, err = recorder.communicate(timeout=WAIT_S * 3)
        stop.touch()
        for p in ranks:
            p.wait(WAIT_S)
    finally:
        for p in [recorder, *ranks]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert recorder.returncode == 0, err
    summary = err.strip().splitlines()[-1]
    refused = int(summary.split(" refused by --auth")[0].rsplit(" ", 1)[1])
    assert refused >= 2, summary
    frames = [wire.decode(f.payload) for f in read_recording(path)]
    assert {f.rank for f in frames} == {0}
    assert sum(isinstance(f, wire.IterationBatch) for f in frames) >= 10
    assert all(p.returncode == 0 for p in ranks)
    for name in ("unkeyed", "wrong"):
        log = logs[name].read_text()
        assert log.count("refused rank 1") == 1 and "trained" in log and "error" not in log, log
    assert "it takes only ranks with keys: set DAGTOP_AUTH=DIR" in logs["unkeyed"].read_text()
    assert f"it does not take the rank key in DAGTOP_AUTH={wrong}" in logs["wrong"].read_text()
    assert "refused" not in logs["keyed"].read_text()


@pytest.mark.parametrize("before_record", [True, False])
def test_auth_given_before_or_after_record_is_kept(tmp_path: Path, endpoint: str, before_record: bool,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # `dagtop --auth DIR record` once recorded without auth: the subcommand's default overwrote DIR.
    auth, rest = ["--auth", str(tmp_path)], ["--bind", endpoint, "-o", str(tmp_path / "r.dagtop")]
    status = main([*auth, "record", *rest] if before_record else ["record", *rest, *auth])
    assert status == Exit.BAD_INPUT and "no monitor.key_secret" in capsys.readouterr().err


@pytest.mark.slow
def test_record_says_when_auth_refused_every_rank(tmp_path: Path, endpoint: str) -> None:
    """The job runs, but no rank holds the key: the recorder must not ask whether the job is running."""
    keys, stop = tmp_path / "keys", tmp_path / "stop"
    assert main(["keygen", str(keys)]) == 0
    recorder = subprocess.Popen(
        [sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o", str(tmp_path / "r.dagtop"),
         "--auth", str(keys), "--timeout", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "rank.log"
    rank = _rank(0, 1, endpoint, stop, log, None)
    try:
        _wait_for(log, "refused rank 0")
        _, err = recorder.communicate(timeout=WAIT_S * 3)
    finally:
        stop.touch()
        for p in (recorder, rank):
            if p.poll() is None:
                p.kill()
            p.wait()
    assert recorder.returncode == Exit.TIMEOUT, err
    last = err.strip().splitlines()[-1]
    assert "--auth refused every rank that connected" in last and f"rank key of {keys}" in last, err
    assert "is the job running" not in err and "Traceback" not in err
