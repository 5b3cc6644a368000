"""The wire format: every frame round-trips, every malformed frame is refused with a reason, nothing crashes."""

from __future__ import annotations

import re

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import wire, wire_fields
from instrument.wire_fields import MAX_NAME_CHARS, Bucket, GpuStats, HostStats

HELLO = wire.Hello(3, 1, 2, 1, "node7", 4242, "cpu", "2.13.0", "DemoNet", 123_456, "block", 1_700_000_000_000_000_000, 5)
EVENTS = (
    wire.Event("io", "load", "next", "main", 10, 20, 0),
    wire.Event("allreduce", "allreduce", "bucket 0", "comm", 30, 90, 150_568),
    wire.Event("compute", "backward", "layer1", "gpu", 40, 40, 0),
)


def _frame(**fields: object) -> bytes:
    base: dict[str, object] = {"v": 1, "k": "iter", "seq": 0, "rank": 0, "it": 0, "ev": [], "dropped": 0}
    base.update(fields)
    return msgpack.packb({k: v for k, v in base.items() if v is not _MISSING}, use_bin_type=True)


_MISSING = object()


@pytest.mark.parametrize(
    "frame",
    [
        HELLO,
        wire.IterationBatch(7, 1, 41, EVENTS, 2),
        wire.IterationBatch(0, 0, 0, (), 0),
        wire.Buckets(1, 0, (Bucket(0, 150_568, ("head.weight", "head.bias")), Bucket(1, 4, ()))),
        wire.Bye(9, 1, 41, 3),
    ],
)
def test_every_frame_kind_round_trips(frame: wire.Frame) -> None:
    assert wire.decode(wire.encode(frame)) == frame


def test_plain_tuples_encode_like_events() -> None:
    """The shim's hot path hands plain 7-tuples to encode_iteration."""
    payload = wire.encode_iteration(1, 0, 5, [tuple(e) for e in EVENTS], 0)
    assert wire.decode(payload) == wire.IterationBatch(1, 0, 5, EVENTS, 0)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1\xc1 not msgpack", "not msgpack"),
        (msgpack.packb([1, 2, 3]), "must be a map"),
        (_frame(v=3), "version 3 is not supported"),
        (_frame(v=_MISSING), "version None"),
        (_frame(k="shout"), "unknown frame kind"),
        (_frame(seq=True), "'seq' must be an integer"),
        (_frame(rank=-1), "out of range"),
        (_frame(it="3"), "'it' must be an integer"),
        (_frame(ev={"a": 1}), "'ev' must be a list"),
        (_frame(ev=[["io", "load", "next", "main", 1, 2]]), "7 fields"),
        (_frame(ev=[["disk", "load", "next", "main", 1, 2, 0]]), "unknown category 'disk'"),
        (_frame(ev=[["io", "nap", "next", "main", 1, 2, 0]]), "unknown phase"),
        (_frame(ev=[["io", "load", "next", "tpu", 1, 2, 0]]), "unknown lane 'tpu'"),
        (_frame(ev=[["io", "load", "next", "main", 5, 4, 0]]), "ends before it starts"),
        (_frame(ev=[["io", "load", "next", "main", True, 4, 0]]), "start must be a non-negative integer"),
        (_frame(ev=[["io", "load", "next", "main", 1, 4, False]]), "bytes must be a non-negative integer"),
        (_frame(ev=[["io", "load", "next", "main", -1, 4, 0]]), "non-negative"),
        (_frame(ev=[["io", "load", 7, "main", 1, 4, 0]]), "name must be a string"),
        (_frame(ev=[["io", "load", "x" * 300, "main", 1, 4, 0]]), "name must be a string of at most"),
        (_frame(dropped=1.5), "'dropped' must be an integer"),
        (_frame(k="hello", rank=2, world=2), None),  # missing fields below are caught one by one
        (_frame(k="buckets", buckets=[[0, 10]]), "must be [index, bytes"),
        (_frame(k="buckets", buckets=[[0, -1, []]]), "non-negative"),
        (_frame(k="buckets", buckets=[[0, 1, [3]]]), "parameter names must be strings"),
        (_frame(k="bye", iterations=None), "'iterations' must be an integer"),
        (b"\x00" * (wire.MAX_FRAME_BYTES + 1), "exceeds"),
        (msgpack.packb({"v": 1, "k": "iter", "ev": msgpack.ExtType(1, b"x")}), "not msgpack"),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(payload: bytes, reason: str | None) -> None:
    with pytest.raises(wire.WireError) as refused:
        wire.decode(payload)
    if reason is not None:
        assert reason in str(refused.value)


def test_hello_rank_must_be_below_world() -> None:
    bad = msgpack.packb({**msgpack.unpackb(wire.encode(HELLO)), "rank": 2, "world": 2})
    with pytest.raises(wire.WireError, match="not below world size"):
        wire.decode(bad)


def test_hello_refuses_bool_as_int() -> None:
    bad = msgpack.packb({**msgpack.unpackb(wire.encode(HELLO)), "params": True})
    with pytest.raises(wire.WireError, match="'params' must be an integer"):
        wire.decode(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_decoder(payload: bytes) -> None:
    try:
        wire.decode(payload)
    except wire.WireError:
        pass


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=10) | st.floats(),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=5), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {"v": st.just(1), "k": st.sampled_from(["hello", "iter", "buckets", "bye", "telemetry"])},
        optional={"seq": _values, "rank": _values, "it": _values, "ev": _values, "dropped": _values,
                  "world": _values, "buckets": _values, "iterations": _values, "host": _values,
                  "local_rank": _values, "mono_ns": _values, "note": _values, "hw": _values, "gpu": _values},
    )
)
def test_structured_garbage_is_refused_not_crashed(m: dict[str, object]) -> None:
    """Frames that are valid msgpack maps of the right version but wrong fields: WireError, nothing else."""
    try:
        wire.decode(msgpack.packb(m, use_bin_type=True))
    except wire.WireError:
        pass


def test_decoded_events_are_columns_that_read_as_events() -> None:
    decoded = wire.decode(wire.encode(wire.IterationBatch(7, 1, 41, EVENTS, 2)))
    assert isinstance(decoded, wire.IterationBatch)
    columns = decoded.events
    assert isinstance(columns, wire.EventColumns)
    assert len(columns) == 3 and columns[1] == EVENTS[1] and columns[-1] == EVENTS[-1]
    assert columns[1:] == EVENTS[1:] and list(columns) == list(EVENTS)
    assert columns == EVENTS and hash(columns) == hash(EVENTS)
    assert list(columns.start_ns) == [10, 30, 40] and columns.name == ("next", "bucket 0", "layer1")
    assert wire.EventColumns.of(EVENTS) == columns and wire.EventColumns.of(columns) is columns


_valid_row = st.tuples(
    st.sampled_from(wire.CATEGORIES), st.sampled_from(wire.PHASES), st.text(max_size=5), st.sampled_from(wire.LANES),
    st.integers(0, 100), st.integers(100, 200), st.integers(0, 10)).map(list)
_odd_value = st.one_of(st.sampled_from(["io", "load", "main", "comm", "x" * 257, "", "disk"]), st.booleans(),
                       st.none(), st.floats(allow_nan=False), st.lists(st.integers(-5, 5), max_size=1),
                       st.sampled_from([-1, 0, 99, 2**63 - 1, 2**63, 2**64 - 1]))


@st.composite
def _event_rows(draw: st.DrawFn) -> list[list[object]]:
    """Valid events, one of them perhaps spoiled in one field (or made the wrong length)."""
    rows = draw(st.lists(_valid_row, min_size=1, max_size=5))
    row = rows[draw(st.integers(0, len(rows) - 1))]
    spoil = draw(st.sampled_from(["none", "field", "short", "long"]))
    if spoil == "field":
        row[draw(st.integers(0, 6))] = draw(_odd_value)
    elif spoil == "short":
        row.pop()
    elif spoil == "long":
        row.append(0)
    return rows


@settings(max_examples=400, deadline=None)
@given(_event_rows())
def test_the_column_checks_accept_exactly_what_the_event_schema_accepts(rows: list[list[object]]) -> None:
    """The decoder validates a frame's events a column at a time; the per-event check is the schema."""
    try:
        expected = tuple(wire_fields.EVENTS.check_row(row, i) for i, row in enumerate(rows))
    except wire.WireError as exc:
        with pytest.raises(wire.WireError, match=re.escape(str(exc))):
            wire.decode(_frame(ev=rows))
    else:
        decoded = wire.decode(_frame(ev=rows))
        assert isinstance(decoded, wire.IterationBatch) and decoded.events == expected


_SPOILERS = {
    0: ["disk", 7, None, ["io"]],
    1: ["nap", 7, None],
    2: [7, None, "x" * (MAX_NAME_CHARS + 1), ["n"]],
    3: ["tpu", 0, None],
    4: [-1, 2**63, 2**64 - 1, True, 1.5, "1", None, 300],  # 300: after the end
    5: [-1, 2**63, True, 1.5, "1", 50],  # 50: before the start
    6: [-1, 2**63, 2**64 - 1, False, 0.5, "0"],
}


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in _SPOILERS.items() for v in values])
def test_every_spoiled_field_is_refused_as_the_event_schema_says(field: int, value: object) -> None:
    good = ["compute", "forward", "block1", "main", 100, 200, 0]
    spoiled = list(good)
    spoiled[field] = value
    with pytest.raises(wire.WireError) as schema:
        wire_fields.EVENTS.check_row(spoiled, 1)
    with pytest.raises(wire.WireError, match=re.escape(str(schema.value))):
        wire.decode(_frame(ev=[good, spoiled, good]))
    edge = ["compute", "forward", "x" * MAX_NAME_CHARS, "comm", 0, 2**63 - 1, 2**63 - 1]
    assert wire.decode(_frame(ev=[good, edge])).events[1] == wire.Event(*edge)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- telemetry

GIB = 2**30
TELEMETRY = wire.Telemetry(
    12, 3, "gpu-node-7", 3, 99_000,
    HostStats(37.5, 96, 300 * GIB, 2000 * GIB),
    GpuStats(3, "NVIDIA H100 80GB HBM3", 97.0, 31 * GIB, 80 * GIB, 1.2e9, 3.4e9, 251.5),
)


@pytest.mark.parametrize(
    "frame",
    [
        TELEMETRY,
        wire.Telemetry(0, 1, "cpu-box", 1, 5, None, None, "on CPU"),
        wire.Telemetry(4, 0, "n", 0, 5, HostStats(None, None, None, None),
                       GpuStats(0, "", None, None, None, None, None, None),
                       "no GPU figures: NVML library not found"),
    ],
)
def test_telemetry_round_trips_with_any_figure_missing(frame: wire.Telemetry) -> None:
    assert wire.decode(wire.encode(frame)) == frame


def _telemetry(**fields: object) -> bytes:
    """The TELEMETRY frame as a map, with ``fields`` replaced (``hw.cpu=...`` reaches into a nested map)."""
    m = msgpack.unpackb(wire.encode(TELEMETRY))
    for key, value in fields.items():
        outer, _, inner = key.partition("__")
        target = m[outer] if inner else m
        name = inner or outer
        if value is _MISSING:
            target.pop(name, None)
        else:
            target[name] = value
    return msgpack.packb(m, use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_telemetry(host=_MISSING), "field 'host' must be a string"),
        (_telemetry(host="h" * 300), "longer than"),
        (_telemetry(local_rank=-1), "'local_rank' = -1 is out of range"),
        (_telemetry(mono_ns=1.5), "'mono_ns' must be an integer"),
        (_telemetry(note=7), "'note' must be a string"),
        (_telemetry(note="x" * 300), "'note' must be a string of at most"),
        (_telemetry(hw=[1, 2]), "'hw' must be nil or a map"),
        (_telemetry(hw__cpu=101.0), "hw: field 'cpu' must be nil or a number in [0, 100]"),
        (_telemetry(hw__cpu=float("nan")), "hw: field 'cpu'"),
        (_telemetry(hw__cpu=True), "hw: field 'cpu'"),
        (_telemetry(hw__cpu="37"), "hw: field 'cpu'"),
        (_telemetry(hw__cpus=0), "'cpus' = 0 is out of range"),
        (_telemetry(hw__mem_used=-1), "hw: field 'mem_used' must be nil or a non-negative integer"),
        (_telemetry(hw__mem_used=3000 * GIB), "hw: mem_used 3221225472000 exceeds mem_total"),
        (_telemetry(gpu="H100"), "'gpu' must be nil or a map"),
        (_telemetry(gpu__index=_MISSING), "field 'index' must be an integer"),
        (_telemetry(gpu__name=7), "field 'name' must be a string"),
        (_telemetry(gpu__util=-3.0), "gpu: field 'util'"),
        (_telemetry(gpu__pcie_tx=float("inf")), "gpu: field 'pcie_tx'"),
        (_telemetry(gpu__power_w=1e300), "gpu: field 'power_w'"),
        (_telemetry(gpu__mem_used=81 * GIB), "gpu: mem_used"),
        (_telemetry(v=3), "version 3 is not supported"),
        (_telemetry(rank="3"), "'rank' must be an integer"),
    ],
)
def test_malformed_telemetry_is_refused_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError) as refused:
        wire.decode(payload)
    assert reason in str(refused.value)


def test_telemetry_ignores_fields_it_does_not_know() -> None:
    """A newer shim may add optional figures within version 1: an older monitor keeps what it knows."""
    assert wire.decode(_telemetry(temperature=71, hw__swap_used=0, gpu__sm_clock=1980)) == TELEMETRY
