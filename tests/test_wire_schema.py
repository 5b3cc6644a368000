"""The wire schema is written once: the codec and docs/wire.md both come from it, and the bytes never moved."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagtop.io.recording import read_recording
from instrument import wire
from instrument.schema import Field, Int, Str, layout_of
from instrument.wire_docs import markdown
from instrument.wire_events import Count, EventList
from instrument.wire_fields import EVENTS, Bucket, GpuStats, HostStats, Loader

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "wire.md"


def test_docs_show_the_tables_generated_from_the_schema() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    generated = markdown()
    first, last = generated.splitlines()[0], generated.splitlines()[-1]
    start, end = docs.find(first), docs.find(last)
    assert 0 <= start < end, f"docs/wire.md lacks the markers {first!r} ... {last!r}"
    assert docs[start:end + len(last)] + "\n" == generated, (
        "docs/wire.md's frame tables differ from the schema: replace them with `python -m instrument.wire_docs`")


def test_python_m_instrument_wire_docs_prints_the_tables() -> None:
    """Run as a script, the module must not also be imported under its own name (-W error: runpy warns of that)."""
    out = subprocess.run([sys.executable, "-W", "error", "-m", "instrument.wire_docs"],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    assert out.stdout == markdown() and not out.stderr


def test_every_documented_key_is_one_the_codec_writes() -> None:
    """Each frame's table lists exactly the keys its encoder writes, in their order on the wire."""
    frames = [  # every field added after the fact set, or it is left off the wire
        wire.Hello(3, 1, 2, 1, "h", 1, "cpu", "t", "M", 1, "block", 1, 1, "1 block: M", "run", "m:1", 1, 1, 7,
                   Loader(2, 32, 100, 2, 1, 0)),
        wire.IterationBatch(0, 0, 0, (), 0, 1, 7, 3, 2, 1, 1, 1, 1),
        wire.Buckets(0, 0, (Bucket(0, 8, ("a", "b")),), 7, ((4, 4),), 1, 1),
        wire.Bye(0, 0, 0, 0, 1, 7),
        wire.Telemetry(0, 0, "h", 0, 0, HostStats(None, None, None, None),
                       GpuStats(0, "g", None, None, None, None, None, None), sender=7),
        wire.Heartbeat(0, 0, 0, "", 0, 1, 7, 1),
    ]
    docs = markdown()
    for frame in frames:
        m = msgpack.unpackb(wire.encode(frame))
        section = docs.split(f"#### `{frame.KIND}`")[1].split("####")[0]
        documented = re.findall(r"^\| `(\w+)` ", section, flags=re.MULTILINE)
        nested = [k for k in ("hw", "gpu", "ev", "loader") if isinstance(m.get(k), dict)]
        written = [k for k in m if k not in ("v", "k", "seq", "rank")] + [k for n in nested for k in m[n]]
        assert documented == written


def test_recorded_frames_decode_and_encode_to_the_very_same_bytes() -> None:
    """Most recordings were written by the encoder before the schema was made declarative, in wire version 1: not a
    byte moved but the version, and an ``iter`` frame's events, now columns, are the same events. Those recorded in
    the current version encode again to the very same bytes."""
    kinds = set()
    for path in sorted((ROOT / "dagtop" / "fixtures").glob("*.dagtop")):
        for raw in read_recording(path):
            frame = wire.decode(raw.payload)
            kinds.add(frame.KIND)
            again = wire.encode(frame)
            assert wire.decode(again) == frame
            if msgpack.unpackb(raw.payload)["v"] == wire.WIRE_VERSION:  # recorded since: byte for byte
                assert again == raw.payload
            elif frame.KIND != "iter":
                assert raw.payload.count(b"\xa1v\x01") == 1
                assert again == raw.payload.replace(b"\xa1v\x01", b"\xa1v\x02")
            else:
                old, new = msgpack.unpackb(raw.payload), msgpack.unpackb(again)
                assert list(old) == list(new) and old["v"] == 1 and new["v"] == 2
    assert {"hello", "iter", "buckets"} <= kinds


def test_a_field_added_later_is_written_only_when_set() -> None:
    """``Hello.units`` came after the recordings: without it a hello is the bytes it was; with it, it round-trips."""
    bare = wire.Hello(3, 1, 2, 1, "h", 1, "cpu", "t", "M", 1, "block", 1, 1)
    assert "units" not in msgpack.unpackb(wire.encode(bare)) and wire.decode(wire.encode(bare)).units == ""
    said = dataclasses.replace(bare, units="6 blocks: embed, layers.0…3, head")
    assert wire.decode(wire.encode(said)) == said


def test_bye_and_telemetry_keep_their_keys_in_their_order() -> None:
    """The kinds no recording holds, against maps written out by hand."""
    assert wire.encode(wire.Bye(9, 1, 41, 3)) == msgpack.packb(
        {"v": 2, "k": "bye", "seq": 9, "rank": 1, "iterations": 41, "dropped": 3})
    telemetry = wire.Telemetry(12, 3, "n7", 3, 99, HostStats(37.5, 96, 3, 20),
                               GpuStats(3, "H100", 97.0, 31, 80, 1.2e9, None, 251.5), "note")
    assert wire.encode(telemetry) == msgpack.packb(
        {"v": 2, "k": "telemetry", "seq": 12, "rank": 3, "host": "n7", "local_rank": 3, "mono_ns": 99, "note": "note",
         "hw": {"cpu": 37.5, "cpus": 96, "mem_used": 3, "mem_total": 20},
         "gpu": {"index": 3, "name": "H100", "util": 97.0, "mem_used": 31, "mem_total": 80, "pcie_tx": 1.2e9,
                 "pcie_rx": None, "power_w": 251.5}}, use_bin_type=True)


_event = st.tuples(
    st.sampled_from(wire.CATEGORIES), st.sampled_from(wire.PHASES), st.text(max_size=8), st.sampled_from(wire.LANES),
    st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40),
).map(lambda e: (*e[:5], e[4] + e[5], e[6]))
_count = st.integers(0, 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(_count, st.integers(0, 1 << 20), _count, st.lists(_event, max_size=20), _count, st.sampled_from([0, 1, 2**40]),
       st.sampled_from([0, 1, 2**31 - 1]), st.none() | st.tuples(*[st.sampled_from([0, 1, 2**40])] * 6))
def test_the_shims_iteration_encoder_writes_what_the_frame_encoder_writes(
        seq: int, rank: int, iteration: int, events: list[tuple[object, ...]], dropped: int, dropped_queue: int,
        sender: int, cpu: tuple[int, int, int, int, int, int] | None) -> None:
    """encode_iteration skips building the frame, not the layout: the same bytes, decoding to the same frame."""
    frame = wire.IterationBatch(seq, rank, iteration, tuple(wire.Event(*e) for e in events), dropped,  # type: ignore[arg-type]
                                dropped_queue, sender, *(cpu or ()))
    payload = wire.encode_iteration(seq, rank, iteration, events, dropped, dropped_queue, sender,
                                    None if cpu is None else wire.ThreadCpu(*cpu))
    assert payload == wire.encode(frame)
    assert wire.decode(payload) == frame


def test_a_field_without_its_wire_description_is_refused() -> None:
    count = {"wire": Field(Int(), "a count")}

    @dataclasses.dataclass(frozen=True)
    class Undescribed:
        seq: int = dataclasses.field(metadata=count)
        secret: int = 0

    with pytest.raises(TypeError, match="Undescribed.secret has no wire metadata"):
        layout_of(Undescribed)

    @dataclasses.dataclass(frozen=True)
    class Misplaced:
        a: int = dataclasses.field(metadata=count)
        b: str = dataclasses.field(default="", metadata={"wire": dataclasses.replace(
            count["wire"], type=Str(3), after="nowhere")})

    with pytest.raises(TypeError, match="no key 'nowhere'"):
        layout_of(Misplaced)


def test_the_event_row_is_held_to_the_fields_its_fast_path_unpacks() -> None:
    row = EVENTS.row
    with pytest.raises(TypeError, match="teach it any change"):
        EventList(10, (*row[:6], Int()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="teach it any change"):
        EventList(10, (*row[:6], Count("size", "bytes")))
    assert EventList(10, row).row == row
