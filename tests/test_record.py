"""``dagtop record``: keeps every raw frame, counts complete iterations, and stops when it should."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers.frames import ListSource, hello

from dagtop.commands.cli import main
from dagtop.commands.record import record
from dagtop.io.recording import RecordingWriter, read_recording
from instrument import wire
from instrument.publisher import Publisher


def _hello(rank: int, world: int = 2) -> bytes:
    return wire.encode(hello(rank, world))


def _iteration(rank: int, it: int) -> bytes:
    return wire.encode_iteration(it + 1, rank, it, [("io", "load", "next", "main", 10, 20, 0)], 0)


def test_stops_once_n_iterations_are_complete_on_every_rank(tmp_path: Path) -> None:
    # Rank 1 misses iteration 0 (slow joiner): complete iterations are counted, not iteration numbers.
    payloads = [_hello(0), _iteration(0, 0), _hello(1)]
    for it in range(1, 10):
        payloads += [_iteration(0, it), _iteration(1, it)]
    with RecordingWriter(tmp_path / "r.dagtop") as writer:
        result = record(ListSource.of_payloads(payloads, batch=3), writer, iterations=3)
    assert result.stopped_because == "iterations"
    assert result.complete == 3 and result.ranks_expected == 2 and result.ranks_seen == {0, 1}
    assert 0 < writer.frames < len(payloads)


def test_undecodable_frames_are_counted_by_reason_not_written(tmp_path: Path) -> None:
    junk = [b"\x00garbage", wire.encode_iteration(0, 0, 0, [], 0).replace(b"\xa1v\x02", b"\xa1v\x09", 1)]
    payloads = [_hello(0, 1), junk[0], _iteration(0, 0), junk[1], wire.encode(wire.Bye(9, 0, 1, 0))]
    path = tmp_path / "r.dagtop"
    with RecordingWriter(path) as writer:
        result = record(ListSource.of_payloads(payloads, batch=3), writer)
    assert [f.payload for f in read_recording(path)] == [payloads[0], payloads[2], payloads[4]]  # no junk
    assert result.rejected == 2 and "not msgpack" in (result.first_rejection or "")
    assert result.rejections == {"not msgpack": 1, "wire version N is not supported (this monitor reads versions N, N)": 1}
    assert (result.frames, result.written, result.stopped_because) == (5, 3, "bye")
    assert "not msgpack ×1" in result.line()


def test_ranks_given_on_the_command_line_override_the_hello(tmp_path: Path) -> None:
    payloads = [_hello(0, 1)] + [_iteration(0, it) for it in range(5)]
    with RecordingWriter(tmp_path / "r.dagtop") as writer:
        result = record(ListSource.of_payloads(payloads, batch=3), writer, iterations=2, ranks=2)
    assert result.complete == 0 and result.stopped_because == "stopped"


def test_ctrl_c_stops_cleanly_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.dagtop"
    with RecordingWriter(path) as writer:
        result = record(ListSource.of_payloads([_hello(0), _iteration(0, 0)], batch=3, end=KeyboardInterrupt()), writer)
    assert result.stopped_because == "interrupted"
    assert len(read_recording(path)) == 2


def test_nothing_received_times_out_with_a_clear_message(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.dagtop"
    start = time.monotonic()
    status = main(["record", "--bind", endpoint, "-o", str(path), "--iterations", "3", "--timeout", "0.5"])
    assert status == 2
    assert 0.5 <= time.monotonic() - start < 60  # it waited out the timeout, and then it gave up
    err = capsys.readouterr().err
    assert "nothing received" in err and endpoint in err and "DAGTOP_ENDPOINT" in err
    assert read_recording(path) == []


def test_record_command_exits_zero_after_n_iterations_from_live_ranks(tmp_path: Path, endpoint: str) -> None:
    """Two publishers (the shim's own) feed the command; it stops by itself once 5 iterations are complete."""
    stop = threading.Event()

    def rank(r: int) -> None:
        def said(seq: int) -> wire.Hello:
            return hello(r, 2, seq, mono_ns=time.perf_counter_ns())

        publisher = Publisher(endpoint, r, said, on_error=lambda exc: None)
        it = 0
        while not stop.is_set():
            now = time.perf_counter_ns()
            publisher.put_iteration(it, [("compute", "update", "optimizer.step", "main", now, now + 5, 0)])
            it += 1
            time.sleep(0.02)
        publisher.close()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    path = tmp_path / "r.dagtop"
    try:
        status = main(["record", "--bind", endpoint, "-o", str(path), "--iterations", "5", "--timeout", "20"])
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert status == 0
    decoded = [wire.decode(f.payload) for f in read_recording(path)]
    assert {f.rank for f in decoded if isinstance(f, wire.Hello)} == {0, 1}
    per_rank = {r: {f.iteration for f in decoded if isinstance(f, wire.IterationBatch) and f.rank == r} for r in (0, 1)}
    assert len(per_rank[0] & per_rank[1]) >= 5
