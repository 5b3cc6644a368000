"""Bounded intake: junk never reaches the recording, rejections are counted by reason, and the monitor's memory
has a bound whatever arrives (frame size, world size, held frames, waiting iterations, missing sequence numbers)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq
from helpers.frames import hello
from helpers.waits import WAIT_S

from dagtop.commands.cli import main
from dagtop.io.recording import read_notes, read_recording
from dagtop.io.sources import ZmqSource
from dagtop.model import admission as admission_module
from dagtop.model import completion as completion_module
from dagtop.model.admission import MAX_WORLD, REASONS_KEPT, Admission, reason_of
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from instrument import wire
from instrument.publisher import Publisher


def _hello(rank: int = 0, world: int = 1, seq: int = 0) -> bytes:
    return wire.encode(hello(rank, world, seq))


def _iteration(rank: int, it: int, seq: int | None = None) -> bytes:
    return wire.encode_iteration(it + 1 if seq is None else seq, rank, it,
                                 [("compute", "update", "optimizer.step", "main", 10, 20, 0)], 0)


def _junk(rng: random.Random, size: int) -> bytes:
    """Random bytes, or msgpack that is a map of the wrong things."""
    if rng.random() < 0.5:
        return rng.randbytes(size)
    return msgpack.packb({"v": 1, "k": rng.choice(["iter", "hello", "zzz"]), "seq": "x" * size, "rank": -1})


def test_rejections_are_counted_by_reason_with_a_sample_of_each() -> None:
    a = Admission()
    a.admit(RawFrame(0, b"\xc1junk"))
    a.admit(RawFrame(0, msgpack.packb({"v": 1, "k": "iter", "seq": -3, "rank": 0})))
    a.admit(RawFrame(0, msgpack.packb({"v": 1, "k": "iter", "seq": -9, "rank": 0})))
    a.admit(RawFrame(0, msgpack.packb({"v": 7})))
    assert a.rejected == 4
    assert a.rejections == {"not msgpack": 1, "field 'seq' = N is out of range [N, N]": 2,
                            "wire version N is not supported (this monitor reads versions N, N)": 1}
    assert a.rejection_samples["field 'seq' = N is out of range [N, N]"].startswith("field 'seq' = -3")
    # What a sender chooses (a kind, a long value) never makes a reason of its own past REASONS_KEPT.
    for i in range(3 * REASONS_KEPT):
        a.admit(RawFrame(0, msgpack.packb({"v": 1, "k": f"k{i}", "seq": 0, "rank": 0})))
    assert len(a.rejections) <= REASONS_KEPT + 1 and a.rejections["other reasons"] > 0
    assert reason_of("unknown frame kind '" + "x" * 500 + "'") == "unknown frame kind …"


def test_a_world_above_what_the_monitor_follows_is_refused() -> None:
    a = Admission()
    assert a.admit(RawFrame(0, _hello(0, MAX_WORLD + 1))) == [] and a.world is None
    assert a.admit(RawFrame(0, _iteration(MAX_WORLD, 0))) == []  # no world yet: still bounded
    assert a.rejected == 2 and a.held == [] and a.ranks == {}
    assert len(a.admit(RawFrame(0, _hello(3, 4)))) == 1 and a.world == 4


def test_held_frames_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "HOLD_BYTES", 10_000)
    a = Admission()
    frame = _iteration(0, 0)
    for it in range(2 * 10_000 // len(frame)):
        a.admit(RawFrame(it, _iteration(0, it)))
    assert 0 < sum(len(raw.payload) for raw, _ in a.held) <= 10_000
    assert a.rejections == {"no hello yet: the world size is unknown": a.rejected} and a.rejected > 0
    released = a.admit(RawFrame(99, _hello(0, 1, seq=0)))
    assert len(released) == 1 + len([f for f in released if isinstance(f[1], wire.IterationBatch)])
    assert a.held == []


def test_missing_sequence_numbers_are_remembered_up_to_a_bound_across_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "MISSING_LIMIT", 1000)
    a = Admission(expected_ranks=8)
    for rank in range(8):
        a.admit(RawFrame(0, _iteration(rank, 0, seq=0)))
        a.admit(RawFrame(0, _iteration(rank, 1, seq=600)))  # a gap of 599 per rank
    assert sum(len(s.missing) for s in a.ranks.values()) <= 1000
    assert a.dropped == 8 * 599  # every gap counted all the same


def test_iterations_that_jump_about_are_refused_and_waiting_ones_keep_memory_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(completion_module, "MAX_PENDING", 16)
    monkeypatch.setattr(completion_module, "MAX_LATE", 16)
    # Iteration numbers that no sequence of frames accounts for make no iteration at all.
    p = Pipeline(expected_ranks=2)
    rng = random.Random(1)
    p.feed([RawFrame(0, _iteration(0, 10 + rng.randrange(10**12), seq=i)) for i in range(2000)])
    assert p.analyses() == [] and p.rejected == 2000
    assert p.rejections == {
        "rank N's first iteration N is beyond what its sequence number N and N discarded frames allow": 2000}
    # A rank whose peer never sends: what waits for it, or is kept open to it, stays bounded.
    p = Pipeline(expected_ranks=2)
    p.feed([RawFrame(0, _iteration(0, it, seq=it)) for it in range(2000)])
    completion = p._completion
    assert len(completion._pending) <= 16 and len(completion._partial) <= 16
    assert len(p.analyses()) <= 120 and p.incomplete > 0


def test_a_frame_over_the_size_cap_never_reaches_the_monitor(endpoint: str) -> None:
    source = ZmqSource(endpoint)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    big, small = context.socket(zmq.PUB), context.socket(zmq.PUB)
    try:
        for s in (big, small):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
        got: list[RawFrame] = []
        deadline = time.monotonic() + WAIT_S
        while not any(f.payload == b"small" for f in got):  # slow joiner: send until one arrives
            assert time.monotonic() < deadline, "the small frame never came"
            big.send(b"\x80" + b"\x00" * wire.MAX_FRAME_BYTES, zmq.NOBLOCK)
            small.send(b"small", zmq.NOBLOCK)
            got += source.poll(0.05)
        assert all(len(f.payload) <= wire.MAX_FRAME_BYTES for f in got)
    finally:
        big.close(0)
        small.close(0)
        context.term()
        source.close()


def test_record_keeps_junk_out_of_the_file_and_says_why(
        tmp_path: Path, endpoint: str, capfd: pytest.CaptureFixture[str]) -> None:
    """A hostile sender floods the port while a real rank publishes: the recording holds the rank's frames only,
    the summary line and ``report --json`` count the junk by reason."""
    stop = threading.Event()
    junk_sent = [0, 0]  # frames, bytes

    def flood() -> None:
        rng = random.Random(7)
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = context.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        while not stop.is_set():
            payload = _junk(rng, 10_000)
            try:
                sock.send(payload, zmq.NOBLOCK)
                junk_sent[0] += 1
                junk_sent[1] += len(payload)
            except zmq.Again:
                time.sleep(0.001)
            if junk_sent[0] % 100 == 0:
                time.sleep(0.001)
        sock.close(0)
        context.term()

    def rank() -> None:
        def said(seq: int) -> wire.Hello:
            return hello(seq=seq, mono_ns=time.perf_counter_ns())

        publisher = Publisher(endpoint, 0, said, on_error=lambda exc: None)
        it = 0
        while not stop.is_set():
            now = time.perf_counter_ns()
            publisher.put_iteration(it, [("compute", "update", "optimizer.step", "main", now, now + 5, 0)])
            it += 1
            time.sleep(0.05)
        publisher.close()

    threads = [threading.Thread(target=flood, daemon=True), threading.Thread(target=rank, daemon=True)]
    for t in threads:
        t.start()
    path = tmp_path / "r.dagtop"
    try:
        # Enough iterations that the flood runs for a while whatever the machine's load.
        status = main(["record", "--bind", endpoint, "-o", str(path), "--iterations", "40", "--timeout", "60"])
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    err = capfd.readouterr().err
    assert status == 0, err
    frames = read_recording(path)
    for raw in frames:
        wire.decode(raw.payload)  # every frame in the file decodes
    intake = read_notes(path)["intake"]
    assert intake["rejected"] > 0 and sum(intake["reasons"].values()) == intake["rejected"]
    assert "not msgpack" in intake["reasons"]
    assert f"{intake['rejected']} rejected (" in err and "not msgpack ×" in err
    kept = os.path.getsize(path)
    assert kept < 200 * len(frames) + 4096  # the rank's small frames and one note, nothing of the junk
    assert junk_sent[1] > kept  # the flood alone would have been larger than the whole file
    assert main(["report", str(path), "--json"]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["intake"]["rejected"] == intake["rejected"] and report["rejected"] == 0
    assert report["intake"]["reasons"]["not msgpack"] == intake["reasons"]["not msgpack"]
    print(f"junk sent: {junk_sent[0]} frames, {junk_sent[1]} bytes; recording: {kept} bytes, {len(frames)} frames")
