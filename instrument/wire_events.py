"""How a frame's events travel: one fixed-order list per event, checked a whole column at a time.

Events travel as lists rather than maps: five times smaller and ten times faster than JSON (FIELD_NOTES). The row
is :class:`~instrument.events.Event`'s fields in order, each described by a :class:`Column`; the frame's
``ev`` field is an :class:`EventList` of them. Stdlib only, no effects at import.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from instrument.events import Event, EventColumns
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
