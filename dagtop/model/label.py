"""``Label``: the base of the model's enums whose value is what a person reads (on screen, in reports, in JSON)."""

from __future__ import annotations

from enum import Enum


class Label(str, Enum):
    """A string enum whose ``str()`` and f-string are its value, not ``Class.MEMBER`` (Python 3.11's ``StrEnum``,
    which 3.10 lacks)."""

    def __str__(self) -> str:
        return str.__str__(self)  # the member's own text, which is its value
