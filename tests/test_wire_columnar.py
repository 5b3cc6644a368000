"""Wire version 2: an iteration's events as typed columns. Each spoiled column is refused with its reason, the
same events decode the same from version 1's rows, and a monitor still reads version 1."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument import wire
from instrument.wire_fields import COLUMNS

EVENTS = [
    ("io", "load", "next", "main", 10, 20, 0),
    ("allreduce", "allreduce", "bucket 0", "comm", 30, 90, 150_568),
    ("compute", "backward", "layer1", "gpu", 40, 40, 0),
    ("compute", "forward", "layer1", "main", 41, 45, 0),
]


def _columns(**spoiled: Any) -> dict[str, Any]:
    columns = COLUMNS.encode(EVENTS)
    columns.update(spoiled)
    return columns


def _frame(version: int = 2, **fields: Any) -> bytes:
    m = {"v": version, "k": "iter", "seq": 3, "rank": 1, "it": 7, "ev": _columns(), "dropped": 0}
    m.update(fields)
    return msgpack.packb(m, use_bin_type=True)


def _int64(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def test_the_shim_sends_version_2_and_both_versions_decode_to_the_same_frame() -> None:
    sent = wire.encode_iteration(3, 1, 7, EVENTS, 0)
    assert msgpack.unpackb(sent)["v"] == 2 == wire.WIRE_VERSION
    rows = _frame(version=1, ev=[list(e) for e in EVENTS])
    assert wire.decode(sent) == wire.decode(rows) == wire.IterationBatch(3, 1, 7, [wire.Event(*e) for e in EVENTS], 0)
    assert wire.decode(wire.encode(wire.decode(sent))) == wire.decode(sent)


def test_names_travel_once_each() -> None:
    columns = COLUMNS.encode(EVENTS)
    assert columns["names"] == ["next", "bucket 0", "layer1"] and columns["n"] == 4
    assert len(columns["name"]) == 4 * 4 and len(columns["start"]) == 4 * 8


@pytest.mark.parametrize(("payload", "reason"), [
    (_frame(ev=[list(e) for e in EVENTS]), "'ev' must be a map of event columns (wire version 2)"),
    (_frame(version=1), "'ev' must be a list"),
    (_frame(ev=_columns(n=5)), "'category' must be a bin of 5 × 1 bytes"),
    (_frame(ev=_columns(n=-1)), "'n' must be an event count"),
    (_frame(ev=_columns(n=True)), "'n' must be an event count"),
    (_frame(ev=_columns(category=None)), "'category' must be a bin"),
    (_frame(ev=_columns(phase="abcd")), "'phase' must be a bin"),
    (_frame(ev=_columns(category=bytes([0, 1, 2, 9]))), "a category code outside"),
    (_frame(ev=_columns(lane=bytes([0, 0, 0, 255]))), "a lane code outside"),
    (_frame(ev=_columns(start=_int64(10, 30, -40, 41))), "a negative start or bytes"),
    (_frame(ev=_columns(bytes=_int64(0, -1, 0, 0))), "a negative start or bytes"),
    (_frame(ev=_columns(end=_int64(20, 90, 39, 45))), "event 2 (layer1): ends before it starts"),
    (_frame(ev=_columns(start=_int64(10, 30, 40))), "'start' must be a bin of 4 × 8 bytes"),
    (_frame(ev=_columns(names=["next", "bucket 0"])), "a name index outside 'names'"),
    (_frame(ev=_columns(names=["next", 7, "layer1"])), "'names' must be a list"),
    (_frame(ev=_columns(names=["x" * 300, "bucket 0", "layer1"])), "'names' must be a list"),
    (_frame(ev=_columns(names=[*"abcde"])), "'names' must be a list of at most 4"),
    (_frame(ev=_columns(name=struct.pack("<4I", 0, 1, 2, 3))), "a name index outside 'names'"),
])
def test_a_spoiled_column_is_refused_with_its_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError) as refused:
        wire.decode(payload)
    assert reason in str(refused.value)


_events = st.lists(st.tuples(
    st.sampled_from(wire.CATEGORIES), st.sampled_from(wire.PHASES), st.text(max_size=12),
    st.sampled_from(wire.LANES), st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**63 - 1),
).map(lambda e: (*e[:4], min(e[4], e[5]), max(e[4], e[5]), e[6])), max_size=50)


@given(_events)
def test_any_events_round_trip_and_agree_with_version_1(events: list[tuple[Any, ...]]) -> None:
    v2 = wire.decode(wire.encode_iteration(0, 0, 0, events, 0))
    v1 = wire.decode(_frame(version=1, seq=0, rank=0, it=0, ev=[list(e) for e in events]))
    assert list(v2.events) == list(v1.events) == [wire.Event(*e) for e in events]
