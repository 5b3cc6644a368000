"""The task record both sides share: :class:`Event`, its vocabulary, and :class:`EventColumns`, a frame's events
stored field by field. Stdlib only: a training rank imports it."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple, overload

CATEGORIES: Final = ("compute", "io", "pcie", "allreduce", "other")
"""What kind of resource a task occupies: the categories of the critical path."""

PHASES: Final = ("load", "h2d", "forward", "backward", "allreduce", "update", "custom")
"""Where a task sits in the iteration; the DAG is assembled from phases, not names."""

LANES: Final = ("main", "gpu", "copy", "comm")
"""Where a task runs. Tasks on one lane of one rank never overlap: program order.

``main`` is the training thread (and CPU compute), ``gpu`` the CUDA compute stream, ``copy``
the host-to-device copies, ``comm`` the collectives (one serial channel, as in WFBP).
"""

SCRIPT: Final = " (script)"
"""Ends the name of a collective the training script called itself, by op (``all_reduce (script)``,
``barrier (script) #2``: the second of one name in an iteration; instrument/collectives.py). The monitor matches
these across ranks as collectives that hold the calling rank's training thread."""
COLLECTIVE_WORDS: Final = ("all-reduce", "all-gather", "reduce-scatter")
"""First word of the collectives dagtop times in a framework (DDP's ``all-reduce bucket 7``, FSDP's
``all-gather layers.0``)."""


def is_collective_task(task: str) -> bool:
    """Whether a task (a heartbeat's open task, an event's name) is a collective: a rank in one waits for the
    others."""
    return task.split(" ", 1)[0] in COLLECTIVE_WORDS or SCRIPT in task


class Event(NamedTuple):
    """One timed task on one rank, as it travels."""

    category: str
    phase: str
    name: str
    lane: str
    start_ns: int
    end_ns: int
    bytes: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


CATEGORY_CODE: Final = {c: i for i, c in enumerate(CATEGORIES)}
PHASE_CODE: Final = {p: i for i, p in enumerate(PHASES)}
LANE_CODE: Final = {lane: i for i, lane in enumerate(LANES)}
"""Name → code, as :class:`EventColumns` stores them."""


class EventColumns(Sequence[Event]):
    """A frame's events stored field by field: what the decoder validates and the monitor's model reads.

    ``category``, ``phase`` and ``lane`` hold codes (indices into CATEGORIES, PHASES, LANES) as signed bytes;
    ``start_ns``, ``end_ns`` and ``bytes`` are int64 arrays. Both are ``array.array`` buffers, which numpy
    maps without a copy, so a monitor never walks the events one by one. As a sequence it yields
    :class:`Event` tuples, built on demand.
    """

    __slots__ = ("category", "phase", "name", "lane", "start_ns", "end_ns", "bytes")  # noqa: RUF023 - Event's order

    def __init__(self, category: array[int], phase: array[int], name: tuple[str, ...], lane: array[int],
                 start_ns: array[int], end_ns: array[int], nbytes: array[int]) -> None:
        self.category, self.phase, self.name, self.lane = category, phase, name, lane
        self.start_ns, self.end_ns, self.bytes = start_ns, end_ns, nbytes

    @classmethod
    def of(cls, events: Iterable[Sequence[Any]]) -> EventColumns:
        """The columns of ``events`` (Event or plain 7-tuples, trusted); ``events`` itself if it is columns.

        Raises:
            KeyError: an unknown category, phase or lane.
        """
        if isinstance(events, EventColumns):
            return events
        rows = list(events)
        if not rows:
            return cls(array("b"), array("b"), (), array("b"), array("q"), array("q"), array("q"))
        category, phase, name, lane, start, end, size = zip(*rows)
        return cls(array("b", map(CATEGORY_CODE.__getitem__, category)),
                   array("b", map(PHASE_CODE.__getitem__, phase)), name, array("b", map(LANE_CODE.__getitem__, lane)),
                   array("q", start), array("q", end), array("q", size))

    def __len__(self) -> int:
        return len(self.start_ns)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Event, ...]: ...

    def __getitem__(self, index: int | slice) -> Event | tuple[Event, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        return Event(CATEGORIES[self.category[index]], PHASES[self.phase[index]], self.name[index],
                     LANES[self.lane[index]], self.start_ns[index], self.end_ns[index], self.bytes[index])

    def __iter__(self) -> Iterator[Event]:
        return map(Event, map(CATEGORIES.__getitem__, self.category), map(PHASES.__getitem__, self.phase),
                   self.name, map(LANES.__getitem__, self.lane), self.start_ns, self.end_ns, self.bytes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventColumns):
            return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))  # equal to a tuple of the same events, so hashed like one

    def __repr__(self) -> str:
        return f"EventColumns({list(self)!r})"
