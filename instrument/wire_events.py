"""How a frame's events travel: as typed columns (wire version 2), or one fixed-order list per event (version 1).

Version 2 (:class:`ColumnarEvents`) sends each field of the events as one msgpack ``bin`` of little-endian fixed
width values, and the names once each with an index per event: the monitor takes a column with
``array.frombytes`` and checks it with C loops, building no Python object per event but the names. Version 1
(:class:`EventList`) sent a list per event, which msgpack turns into seven Python objects per event; monitors
still read it (old ranks, old recordings). The row is :class:`~instrument.events.Event`'s fields in order, each
described by a :class:`Column`. Stdlib only, no effects at import.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from instrument.events import CATEGORIES, CATEGORY_CODE, LANE_CODE, LANES, PHASE_CODE, PHASES, Event, EventColumns
from instrument.schema import INT64_MAX, FieldType, WireError, number

_START: Final = Event._fields.index("start_ns")
_END: Final = Event._fields.index("end_ns")
_NAME: Final = Event._fields.index("name")
_ROW_TYPES: Final = frozenset((list, tuple))


class _Misfit(Exception):
    """The fast column checks found something wrong; the event-by-event check says what."""


class Column:
    """One field of the event row: its check (the schema of that field) and its line in docs/wire.md."""

    __slots__ = ()
    field: str
    """The :class:`Event` field it carries."""

    def check(self, value: Any, index: int) -> None:
        """Raises WireError, naming event ``index``, if ``value`` does not fit."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Vocabulary(Column):
    """A name from a fixed vocabulary, stored as its code (its index there)."""

    field: str
    names: tuple[str, ...]
    codes: Mapping[str, int]

    def check(self, value: Any, index: int) -> None:
        if value not in self.names:
            raise WireError(f"event {index}: unknown {self.field} {value!r}")

    def describe(self) -> str:
        return "one of " + ", ".join(f"`{name}`" for name in self.names)


@dataclass(frozen=True, slots=True)
class Name(Column):
    """A string of at most ``limit`` characters."""

    field: str
    limit: int

    def check(self, value: Any, index: int) -> None:
        if not isinstance(value, str) or len(value) > self.limit:
            raise WireError(f"event {index}: {self.field} must be a string of at most {self.limit} characters")

    def describe(self) -> str:
        return f"string, at most {self.limit} characters"


@dataclass(frozen=True, slots=True)
class Count(Column):
    """A non-negative integer that fits int64: nanoseconds, bytes."""

    field: str
    label: str
    """What messages call it."""

    def check(self, value: Any, index: int) -> None:
        if type(value) is not int or not 0 <= value <= INT64_MAX:
            raise WireError(f"event {index}: {self.label} must be a non-negative integer")

    def describe(self) -> str:
        return f"integer in [0, {number(INT64_MAX)}]"


EventRow = tuple[Vocabulary, Vocabulary, Name, Vocabulary, Count, Count, Count]
"""The kinds of the event's fields, in order: what :meth:`EventList.columns` is written for."""
_FAST_PATH_ROW: Final = (Vocabulary, Vocabulary, Name, Vocabulary, Count, Count, Count)


@dataclass(frozen=True, slots=True)
class EventList(FieldType):
    """A frame's events: a list of rows laid out by ``row``, decoded into :class:`EventColumns`."""

    max_events: int
    row: EventRow

    def __post_init__(self) -> None:
        if tuple(map(type, self.row)) != _FAST_PATH_ROW or tuple(c.field for c in self.row) != Event._fields:
            raise TypeError(f"the event row must carry {Event._fields} as {[c.__name__ for c in _FAST_PATH_ROW]}: "
                            "EventList.columns() is written for that row; teach it any change")

    def decode(self, value: Any, key: str, where: str) -> EventColumns:
        if not isinstance(value, list) or len(value) > self.max_events:
            raise WireError(f"field {key!r} must be a list of events")
        return self.columns(value)

    def encode(self, value: Any) -> Any:
        return value if type(value) is list else list(value)

    def describe(self) -> str:
        return f"list of at most {self.max_events:,} events, each a list (below)"

    def check_row(self, raw: Any, index: int) -> Event:
        """The schema of one event: the first thing wrong with ``raw``, or the event it encodes."""
        if not isinstance(raw, (list, tuple)) or len(raw) != len(self.row):
            raise WireError(f"event {index} must be a list of {len(self.row)} fields")
        for column, value in zip(self.row, raw):
            column.check(value, index)
        if raw[_END] < raw[_START]:
            raise WireError(f"event {index} ({raw[_NAME]}): ends before it starts")
        return Event(*raw)

    def columns(self, raw: list[Any]) -> EventColumns:
        """Validate and transpose a frame's events, a whole field at a time (C loops, no Python per event).

        Anything these checks refuse goes through :meth:`check_row` one event at a time, which raises the
        precise reason: that is the schema, and these checks must accept exactly what it accepts
        (tests/test_wire.py spoils every field to hold them to it). Written out field by field, not as a loop
        over the row: a loop costs a fifth more on a frame of a few events, and the monitor decodes thousands of
        frames a second; ``__post_init__`` holds the row to the fields unpacked here.
        """
        if not raw:
            return EventColumns.of(())
        category, phase, name, lane, _start, _end, _size = self.row
        try:
            if not set(map(type, raw)) <= _ROW_TYPES or set(map(len, raw)) != {len(self.row)}:
                raise _Misfit
            categories, phases, names, lanes, starts, ends, sizes = zip(*raw)
            columns = EventColumns(
                array("b", map(category.codes.__getitem__, categories)), array("b", map(phase.codes.__getitem__, phases)),
                names, array("b", map(lane.codes.__getitem__, lanes)), array("q", starts), array("q", ends),
                array("q", sizes))
            if set(map(type, names)) != {str} or max(map(len, names)) > name.limit:
                raise _Misfit
            if set(map(type, starts)) | set(map(type, ends)) | set(map(type, sizes)) != {int}:  # no bool, no float
                raise _Misfit
            # Not the ends: they are checked against the starts instead.
            if min(columns.start_ns) < 0 or min(columns.bytes) < 0 or any(map(operator.gt, starts, ends)):
                raise _Misfit
        except (_Misfit, KeyError, TypeError, OverflowError):
            for i, e in enumerate(raw):
                self.check_row(e, i)
            raise WireError("events do not fit the schema") from None
        return columns

    def markdown_rows(self) -> list[tuple[str, ...]]:
        """(position, field, value) of each field of the row."""
        rows: list[tuple[str, ...]] = [(str(i), f"`{c.field}`", c.describe()) for i, c in enumerate(self.row)]
        end = rows[_END]
        rows[_END] = (*end[:2], f"{end[2]}, not below `{self.row[_START].field}`")
        return rows


_LITTLE_ENDIAN: Final = sys.byteorder == "little"
if array("I").itemsize != 4 or array("q").itemsize != 8:
    raise ImportError("instrument.wire_events needs 4-byte array('I') and 8-byte array('q')")


def _le_bytes(values: array[int]) -> bytes:
    """The array's values little-endian, whatever this machine's order."""
    if _LITTLE_ENDIAN:
        return values.tobytes()
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


@dataclass(frozen=True, slots=True)
class ColumnarEvents(FieldType):
    """Wire version 2: a frame's events as a map of columns, each of ``n`` values.

    ``category``, ``phase``, ``lane``: int8 codes (indices into the vocabularies); ``start``, ``end``, ``bytes``:
    int64; ``names``: each distinct name once, as a list of strings; ``name``: uint32 index into ``names`` per
    event. Every ``bin`` is little-endian. It accepts exactly the events :class:`EventList` accepts.
    """

    max_events: int
    name_limit: int

    VOCABULARIES: ClassVar = (("category", CATEGORIES), ("phase", PHASES), ("lane", LANES))
    COUNTS: ClassVar = (("start", "start"), ("end", "end"), ("bytes", "bytes"))

    def encode(self, value: Any) -> dict[str, Any]:
        """The columns of ``value``: :class:`EventColumns`, or the shim's 7-tuples (trusted: a rank's own events).

        Runs on the rank's publisher thread once per iteration, so every step is a C loop over a column.
        """
        name: Sequence[str]
        start: Iterable[int]
        end: Iterable[int]
        size: Iterable[int]
        if isinstance(value, EventColumns):
            category, phase, lane = (_le_bytes(c) for c in (value.category, value.phase, value.lane))
            name, start, end, size = value.name, value.start_ns, value.end_ns, value.bytes
        else:
            rows = value if isinstance(value, list) else list(value)
            if not rows:
                return self.encode(EventColumns.of(()))
            categories, phases, name, lanes, start, end, size = zip(*rows)
            # Codes are below 128: a byte each, the same bytes as int8.
            category = bytes(map(CATEGORY_CODE.__getitem__, categories))
            phase, lane = bytes(map(PHASE_CODE.__getitem__, phases)), bytes(map(LANE_CODE.__getitem__, lanes))
        names = dict.fromkeys(name)  # each name once, in order of first use
        numbered = dict(zip(names, range(len(names))))
        return {"n": len(name), "category": category, "phase": phase, "lane": lane, "names": list(names),
                "name": _le_bytes(array("I", map(numbered.__getitem__, name))), "start": _le_bytes(array("q", start)),
                "end": _le_bytes(array("q", end)), "bytes": _le_bytes(array("q", size))}

    def decode(self, value: Any, key: str, where: str) -> EventColumns:
        """Every check is a C loop over a whole column (``bytes.translate``, ``min``, ``map``): no Python line runs
        per event. Stdlib only, as the rest of the shim's package: numpy would halve the order check's cost."""
        if not isinstance(value, dict):
            raise WireError(f"field {key!r} must be a map of event columns (wire version 2)")
        n = value.get("n")
        if type(n) is not int or not 0 <= n <= self.max_events:
            raise WireError(f"field {key!r}: 'n' must be an event count in [0, {self.max_events}]")
        codes = []
        for field, vocabulary in self.VOCABULARIES:
            raw = _raw(value, key, field, 1, n)
            if raw.translate(None, _CODES[len(vocabulary)]):  # what is left is not a code of the vocabulary
                raise WireError(f"field {key!r}: a {field} code outside 0..{len(vocabulary) - 1}")
            codes.append(_array(raw, "b"))
        start_raw, end_raw, size_raw = (_raw(value, key, field, 8, n) for field, _ in self.COUNTS)
        if start_raw[7::8].translate(None, _POSITIVE_HIGH_BYTES) or size_raw[7::8].translate(None, _POSITIVE_HIGH_BYTES):
            raise WireError(f"field {key!r}: a negative start or bytes")  # the sign is the top bit of the last byte
        names = value.get("names")
        if not isinstance(names, list) or len(names) > n or (names and (
                set(map(type, names)) != {str} or max(map(len, names)) > self.name_limit)):
            raise WireError(f"field {key!r}: 'names' must be a list of at most {n} strings of at most "
                            f"{self.name_limit} characters")
        index = _array(_raw(value, key, "name", 4, n), "I")
        try:
            name = operator.itemgetter(*index)(names) if n > 1 else tuple(names[i] for i in index)
        except IndexError:
            raise WireError(f"field {key!r}: a name index outside 'names'") from None
        start, end = _array(start_raw, "q"), _array(end_raw, "q")
        if any(map(operator.gt, start, end)):
            i = next(i for i, (s, e) in enumerate(zip(start, end)) if s > e)
            raise WireError(f"event {i} ({name[i]}): ends before it starts")
        category, phase, lane = codes
        return EventColumns(category, phase, name, lane, start, end, _array(size_raw, "q"))

    def describe(self) -> str:
        return (f"map of the events' columns, at most {self.max_events:,} events (below); "
                "version 1: a list of events, each a list")

    def markdown_rows(self) -> list[tuple[str, ...]]:
        """(key, value) of each column."""
        rows: list[tuple[str, ...]] = [("`n`", "integer: the number of events"),
                *((f"`{field}`", f"bin: n int8 codes, into {', '.join(f'`{v}`' for v in vocabulary)}")
                  for field, vocabulary in self.VOCABULARIES),
                ("`names`", f"list of the distinct names, each a string of at most {self.name_limit} characters"),
                ("`name`", "bin: n uint32, each an index into `names`"),
                ("`start`", "bin: n int64 ns, not negative"), ("`end`", "bin: n int64 ns, not below `start`"),
                ("`bytes`", "bin: n int64, not negative")]
        return rows


_CODES: Final = {size: bytes(range(size)) for size in (len(CATEGORIES), len(PHASES), len(LANES))}
"""Per vocabulary size, the bytes that are its codes."""
_POSITIVE_HIGH_BYTES: Final = bytes(range(0x80))
"""The last byte of a little-endian int64 that is not negative."""


def _raw(value: dict[str, Any], key: str, field: str, width: int, n: int) -> bytes:
    raw = value.get(field)
    if type(raw) is not bytes or len(raw) != n * width:
        raise WireError(f"field {key!r}: {field!r} must be a bin of {n} × {width} bytes")
    return raw


def _array(raw: bytes, typecode: str) -> array[int]:
    column = array(typecode)
    column.frombytes(raw)
    if not _LITTLE_ENDIAN:
        column.byteswap()
    return column
