"""The task record both sides share: :class:`Event`, its vocabulary, and :class:`EventColumns`, a frame's events
stored field by field. Stdlib only: a training rank imports it.

The vocabulary is declared here once: the categories, phases and lanes; the kinds of task the shim times
(:class:`TaskKind`: ``FORWARD``, ``LOAD``, ...), with which every event is built; and the kinds of collective
(:class:`CollectiveKind`), whose names (``all-gather layers.0``) the shim writes with :func:`collective_name` and the
monitor reads with :func:`collective_kind`; and what a heartbeat's open task is (:class:`TaskState`), sent beside
its name so that the monitor parses none. A new kind of task or collective is one line here.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple, TypeAlias, overload

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


class TaskState(enum.IntEnum):
    """Where a rank is, as its heartbeat says beside the task's name (``state``), so that the monitor reads no
    grammar from the name. The value is what travels; 0 is what an older rank's heartbeat decodes to."""

    UNKNOWN = 0
    """Not said: a rank from before the field, or one with nothing to say yet."""
    OPEN = 1
    """A task is open (``forward layers.3``, ``loader next``, ``optimizer.step``): the rank is working in it."""
    COLLECTIVE = 2
    """A collective is open (``all-reduce bucket 7``, ``barrier (script)``): the rank waits in it for the others."""
    BETWEEN = 3
    """No task is open: ``after X`` (X ended last) or ``between iterations``."""


class CollectiveKind(enum.Enum):
    """The collectives dagtop times in a framework; the value is the first word of such a collective's name."""

    ALL_REDUCE = "all-reduce"
    """DDP's gradient buckets (``all-reduce bucket 7``), HSDP's replica all-reduce (``all-reduce layers.0``)."""
    ALL_GATHER = "all-gather"
    """FSDP's parameter gathers (``all-gather layers.0``, ``all-gather layers.0 (backward)``)."""
    REDUCE_SCATTER = "reduce-scatter"
    """FSDP's gradient reduce-scatters (``reduce-scatter layers.0``)."""


_COLLECTIVE_BY_WORD: Final = {kind.value: kind for kind in CollectiveKind}


def collective_name(kind: CollectiveKind, subject: str) -> str:
    """The task name of a collective of ``kind`` on ``subject`` (a bucket, a unit), as the monitor matches it
    across ranks.

    >>> collective_name(CollectiveKind.ALL_GATHER, "layers.0")
    'all-gather layers.0'
    """
    return f"{kind.value} {subject}"


def collective_kind(name: str) -> CollectiveKind | None:
    """The kind of a collective named by :func:`collective_name`; None for any other task (a script's own
    collectives, named ``<op> (script)``, included).

    >>> collective_kind("reduce-scatter layers.3"), collective_kind("backward layers.3")
    (<CollectiveKind.REDUCE_SCATTER: 'reduce-scatter'>, None)
    """
    return _COLLECTIVE_BY_WORD.get(name.split(" ", 1)[0])


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


RawEvent: TypeAlias = tuple[str, str, str, str, Any, Any, int]
"""An event as the hooks record it: :class:`Event`'s fields, but its start and end are stamps (``perf_counter_ns``
on CPU, a CUDA event on a GPU, resolved on the publisher thread). A plain tuple, the cheapest thing to build in a
hook; :meth:`TaskKind.event` builds one away from the hot paths."""


class TaskKind(NamedTuple):
    """A kind of task: the category and phase every event of it carries (see :data:`TASK_KINDS`)."""

    category: str
    phase: str

    def event(self, name: str, lane: str, start: Any, end: Any, nbytes: int = 0) -> RawEvent:
        """One task of this kind, as the hooks record it."""
        return (self.category, self.phase, name, lane, start, end, nbytes)


def task_kind(category: str, phase: str) -> TaskKind:
    """A :class:`TaskKind`, checked against the vocabulary when it is declared, not when a frame is encoded.

    Raises:
        ValueError: an unknown category or phase.
    """
    if category not in CATEGORIES or phase not in PHASES:
        raise ValueError(f"no task kind ({category!r}, {phase!r}): categories {CATEGORIES}, phases {PHASES}")
    return TaskKind(category, phase)


LOAD: Final = task_kind("io", "load")
"""The loader's ``next()``, the wait the training loop sees."""
COPY: Final = task_kind("pcie", "h2d")
"""A batch's host-to-device copy."""
FORWARD: Final = task_kind("compute", "forward")
BACKWARD: Final = task_kind("compute", "backward")
UPDATE: Final = task_kind("compute", "update")
"""``optimizer.step()``."""
COLLECTIVE: Final = task_kind("allreduce", "allreduce")
"""A collective across ranks (:class:`CollectiveKind`, or the script's own): matched across ranks by name."""
SYNC_ON_MAIN: Final = task_kind("allreduce", "custom")
"""Communication the training thread waits for that is matched across ranks by no name (DDP's buffer broadcast,
the Trainer's token count all-reduce)."""
TASK_KINDS: Final = (LOAD, COPY, FORWARD, BACKWARD, UPDATE, COLLECTIVE, SYNC_ON_MAIN)
"""Every kind the shim times itself; a script's own tasks (``tracer.task``) are ``(category, "custom")``."""


def custom(category: str) -> TaskKind:
    """The kind of a task the script times itself (``tracer.task(name, category)``)."""
    return task_kind(category, "custom")


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
