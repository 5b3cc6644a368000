"""The wire schema's grammar: field types that check, encode and describe a value, and the layout of a frame.

A frame is a frozen dataclass whose fields carry their wire key, type and meaning as metadata (:func:`wire`).
:func:`layout_of` reads that once; the codec and the documentation then walk the :class:`Layout`, so a
frame is written down in one place. instrument/wire.py declares the frames; this module knows none of them.
Stdlib only, no effects at import.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

INT64_MAX: Final = 2**63 - 1


class WireError(ValueError):
    """A frame that does not fit the schema; the message says why."""


def number(value: float) -> str:
    """``value`` as the documentation writes a bound: large powers of two (and 2^63−1) as powers."""
    if not isinstance(value, int):
        return f"{value:g}"
    if value >= 1 << 16 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    if value >= 1 << 16 and value & (value + 1) == 0:
        return f"2^{value.bit_length()}−1"
    return str(value)


class FieldType:
    """How one value travels: how it is checked when decoded, encoded, and described in docs/wire.md."""

    __slots__ = ()

    absent: ClassVar[Any] = None
    """What a key missing from the frame reads as (then checked like any value)."""
    omitted_when_absent: ClassVar[bool] = False
    """Left off the wire when the value is ``absent``: a field added to a frame after the fact (:class:`Added`)."""

    def decode(self, value: Any, key: str, where: str) -> Any:
        """The checked value; ``where`` names the enclosing map ("" at the top of a frame).

        Raises:
            WireError: the value does not fit; the message names ``key``.
        """
        return value

    def encode(self, value: Any) -> Any:
        return value

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Bounded(FieldType):
    """What :class:`Int` and :class:`OptInt` share: an integer's bounds, their check and their description."""

    lo: int = 0
    hi: int = INT64_MAX

    def describe(self) -> str:
        return f"integer in [{number(self.lo)}, {number(self.hi)}]"

    def bounded(self, value: int, key: str, within: str = "") -> int:
        """``value`` if it lies in [lo, hi]; ``within`` opens the message (an enclosing map's name and a colon)."""
        if not self.lo <= value <= self.hi:
            raise WireError(f"{within}field {key!r} = {value} is out of range [{self.lo}, {self.hi}]")
        return value


@dataclass(frozen=True, slots=True)
class Int(Bounded):
    """An integer in [lo, hi]; never a bool, never a float."""

    def decode(self, value: Any, key: str, where: str) -> int:
        if type(value) is not int:  # bool is an int subclass: refuse it too
            raise WireError(f"field {key!r} must be an integer, got {type(value).__name__}")
        return self.bounded(value, key)


@dataclass(frozen=True, slots=True)
class Str(FieldType):
    """A string of at most ``limit`` characters."""

    limit: int

    def decode(self, value: Any, key: str, where: str) -> str:
        if not isinstance(value, str):
            raise WireError(f"field {key!r} must be a string, got {type(value).__name__}")
        if len(value) > self.limit:
            raise WireError(f"field {key!r} is longer than {self.limit} characters")
        return value

    def describe(self) -> str:
        return f"string, at most {self.limit} characters"


@dataclass(frozen=True, slots=True)
class Text(Str):
    """A :class:`Str` that may be left out: then it is empty."""

    absent: ClassVar[Any] = ""

    def decode(self, value: Any, key: str, where: str) -> str:
        try:  # Str.decode, not super(): a slots dataclass is a rebuilt class, which zero-argument super() misses
            return Str.decode(self, value, key, where)
        except WireError:  # one reason for both faults, as these fields always said
            raise WireError(f"field {key!r} must be a string of at most {self.limit} characters") from None

    def describe(self) -> str:
        return f"{Str.describe(self)}; empty if absent"


@dataclass(frozen=True, slots=True)
class Added(Text):
    """A :class:`Text` field added to a frame after its version was fixed: written only when not empty, so a frame
    that does not use it is byte for byte what it was before the field existed, and older monitors ignore it."""

    omitted_when_absent: ClassVar[bool] = True

    def describe(self) -> str:
        return f"{Str.describe(self)}; left out when empty"


@dataclass(frozen=True, slots=True)
class AddedInt(Int):
    """An :class:`Int` field added to a frame after its version was fixed: 0 when absent, and written only when not
    0, so that a frame that does not use it is byte for byte what it was before, and older monitors ignore it."""

    absent: ClassVar[Any] = 0
    omitted_when_absent: ClassVar[bool] = True

    def describe(self) -> str:
        return f"{Bounded.describe(self)}; 0 if absent, left out when 0"


def _within(where: str) -> str:
    return f"{where}: " if where else ""


@dataclass(frozen=True, slots=True)
class OptInt(Bounded):
    """nil (not measurable there), or a non-negative integer in [lo, hi]."""

    def decode(self, value: Any, key: str, where: str) -> int | None:
        if value is None:
            return None
        if type(value) is not int or not 0 <= value <= INT64_MAX:
            raise WireError(
                f"{_within(where)}field {key!r} must be nil or a non-negative integer, got {value!r:.40}")
        return self.bounded(value, key, _within(where))

    def describe(self) -> str:
        return f"nil or {Bounded.describe(self)}"


@dataclass(frozen=True, slots=True)
class OptFloat(FieldType):
    """nil (not measurable there), or a finite number in [0, hi]; decoded as a float."""

    hi: float

    def decode(self, value: Any, key: str, where: str) -> float | None:
        if value is None:
            return None
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= self.hi:
            raise WireError(
                f"{_within(where)}field {key!r} must be nil or a number in [0, {self.hi:g}], got {value!r:.40}")
        return float(value)

    def describe(self) -> str:
        return f"nil or number in [0, {number(self.hi)}]"


@dataclass(frozen=True, slots=True)
class Map(FieldType):
    """nil, or a map laid out by the dataclass ``cls`` (its own fields carry their metadata)."""

    cls: type

    def decode(self, value: Any, key: str, where: str) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise WireError(f"field {key!r} must be nil or a map, got {type(value).__name__}")
        return layout_of(self.cls).decode(value, where=key)

    def encode(self, value: Any) -> Any:
        return None if value is None else layout_of(self.cls).encode(value)

    def describe(self) -> str:
        return "nil or map (below)"


@dataclass(frozen=True, slots=True)
class AddedMap(Map):
    """A :class:`Map` added to a frame after its version was fixed: left off the wire when nil, so a frame without
    it is byte for byte what it was before the field existed, and older monitors ignore it."""

    omitted_when_absent: ClassVar[bool] = True

    def describe(self) -> str:
        return "map (below); left out when nil"


@dataclass(frozen=True, slots=True)
class AddedIntLists(FieldType):
    """Lists of non-negative integers (one list per entry of a sibling field), added after the frame's version was
    fixed: left off the wire when there are none."""

    absent: ClassVar[Any] = ()
    omitted_when_absent: ClassVar[bool] = True

    def decode(self, value: Any, key: str, where: str) -> tuple[tuple[int, ...], ...]:
        if not isinstance(value, (list, tuple)):
            raise WireError(f"{_within(where)}field {key!r} must be a list of lists of integers")
        out = []
        for i, row in enumerate(value):
            if not isinstance(row, (list, tuple)) or not all(type(x) is int and 0 <= x <= INT64_MAX for x in row):
                raise WireError(f"{_within(where)}field {key!r}: entry {i} must be a list of non-negative integers")
            out.append(tuple(row))
        return tuple(out)

    def encode(self, value: Any) -> Any:
        return tuple(list(row) for row in value)  # () when empty: equal to ``absent``, so left out

    def describe(self) -> str:
        return "list of lists of non-negative integers; left out when empty"


Check = Callable[[Mapping[str, Any], str], None]
"""A rule across fields, run once its field is decoded: (the values decoded so far by attribute, where)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a frame as it travels: its key, its type, what it means, and any rule it closes."""

    type: FieldType
    doc: str
    key: str = ""
    """The wire key; the attribute's name if empty."""
    after: str = ""
    """The key this field follows on the wire, where that differs from the dataclass's order."""
    check: Check | None = None
    attr: str = ""
    """The dataclass attribute; filled in by :func:`layout_of`."""


def wire(type_: FieldType, doc: str, *, key: str = "", after: str = "", check: Check | None = None) -> dict[str, Field]:
    """A dataclass field's metadata: ``field(metadata=wire(Int(), "what it means"))``."""
    return {"wire": Field(type_, doc, key, after, check)}


class Layout:
    """A dataclass as a map on the wire: its fields in wire order, and the codec that walks them."""

    __slots__ = ("_decoders", "_encoders", "_omitted", "_positional", "cls", "fields")

    def __init__(self, cls: type, fields: tuple[Field, ...]) -> None:
        self.cls = cls
        self.fields = fields
        # The walk, flattened once: frames are decoded by the hundred per second, by the thousand at scale.
        self._encoders = tuple((f.key, f.attr, None if type(f.type).encode is FieldType.encode else f.type.encode)
                               for f in fields)
        self._decoders = tuple((f.attr, f.key, f.type.absent, f.type.decode, f.check) for f in fields)
        self._omitted = tuple((f.key, f.type.absent) for f in fields if f.type.omitted_when_absent)
        # Where the wire's order is the constructor's, build by position: cheaper than by keyword.
        self._positional = [f.attr for f in fields] == [f.name for f in dataclasses.fields(cls)]

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def encode(self, obj: Any, into: dict[str, Any] | None = None) -> dict[str, Any]:
        """``obj``'s fields as a map, in wire order, after what ``into`` already holds."""
        m = {} if into is None else into
        for key, attr, encode in self._encoders:
            m[key] = getattr(obj, attr) if encode is None else encode(getattr(obj, attr))
        for key, absent in self._omitted:
            if m[key] == absent:
                del m[key]
        return m

    def decode(self, m: Mapping[Any, Any], where: str = "") -> Any:
        """An instance of ``cls`` from the map ``m``, checking its fields in wire order.

        Args:
            m: the map as msgpack decoded it; keys this layout does not know are ignored.
            where: the key of the enclosing map, for messages ("" at the top of a frame).
        """
        values: dict[str, Any] = {}
        for attr, key, absent, decode, check in self._decoders:
            values[attr] = decode(m.get(key, absent), key, where)
            if check is not None:
                check(values, where)
        return self.cls(*values.values()) if self._positional else self.cls(**values)


_LAYOUTS: dict[type, Layout] = {}


def layout_of(cls: type) -> Layout:
    """The wire layout of a dataclass whose every field carries :func:`wire` metadata (worked out once per class).

    Raises:
        TypeError: a field without wire metadata, or placed after a key the class does not have.
    """
    if cls in _LAYOUTS:
        return _LAYOUTS[cls]
    placed: list[Field] = []
    for spec in dataclasses.fields(cls):
        f = spec.metadata.get("wire")
        if not isinstance(f, Field):
            raise TypeError(f"{cls.__name__}.{spec.name} has no wire metadata")
        f = dataclasses.replace(f, key=f.key or spec.name, attr=spec.name)
        if f.after:
            keys = [p.key for p in placed]
            if f.after not in keys:
                raise TypeError(f"{cls.__name__}.{spec.name}: no key {f.after!r} before it to follow")
            placed.insert(keys.index(f.after) + 1, f)
        else:
            placed.append(f)
    layout = _LAYOUTS[cls] = Layout(cls, tuple(placed))
    return layout
