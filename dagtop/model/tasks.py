"""An iteration's tasks: kept as the analysis's columns, made :class:`Task` tuples only where they are read.

At 1024 ranks of 400 events an iteration has 410 000 tasks. Made tuples all at once they cost the collector
0.1–0.14 s an iteration, some 100 bytes each while the iteration stays in the window, and the garbage collector a
walk over each (a tuple subclass is never untracked). The screen draws the tasks of the 20 or so ranks it shows,
so :class:`Tasks` keeps the columns and makes a rank's tuples the first time they are asked for; iterating over
all of them (an export) makes them all, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt

from instrument.events import CATEGORIES, LANES, PHASES

I64 = npt.NDArray[np.int64]
CATEGORY_NAMES = np.array(CATEGORIES, dtype=object)
PHASE_NAMES = np.array(PHASES, dtype=object)
LANE_NAMES = np.array(LANES, dtype=object)
"""Code → name, as object arrays: indexing them with a code array names a whole column at once."""


class Task(NamedTuple):
    """One timed task of one rank in one iteration, on the common clock: an :class:`~instrument.events.Event`
    with its rank in front (the same fields in the same order, the same units)."""

    rank: int
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


_make_task = partial(tuple.__new__, Task)


@dataclass(frozen=True, slots=True, eq=False)
class TaskColumns:
    """Every task of an iteration as a row of equal-length arrays: category, phase and lane as their wire codes
    (:mod:`instrument.events`), the name as an index into ``names``."""

    rank: I64
    category: I64
    phase: I64
    name: I64
    lane: I64
    start_ns: I64
    end_ns: I64
    bytes: I64
    names: npt.NDArray[np.object_]

    def __len__(self) -> int:
        return len(self.rank)

    def rows(self, index: I64 | slice) -> tuple[Task, ...]:
        """The rows at ``index`` as tasks, made by C loops over the columns."""
        columns = (self.rank[index].tolist(), CATEGORY_NAMES[self.category[index]].tolist(),
                   PHASE_NAMES[self.phase[index]].tolist(), self.names[self.name[index]].tolist(),
                   LANE_NAMES[self.lane[index]].tolist(), self.start_ns[index].tolist(),
                   self.end_ns[index].tolist(), self.bytes[index].tolist())
        return tuple(map(_make_task, zip(*columns, strict=True)))


class _ByRank(Mapping[int, tuple[Task, ...]]):
    """Rank → its tasks, each rank's made from the columns on its first read and kept."""

    def __init__(self, columns: TaskColumns, rows: Mapping[int, Sequence[tuple[int, int]]]) -> None:
        self._columns, self._rows = columns, rows
        self._made: dict[int, tuple[Task, ...]] = {}

    def __getitem__(self, rank: int) -> tuple[Task, ...]:
        made = self._made.get(rank)
        if made is None:
            ranges = self._rows[rank]  # KeyError for a rank without tasks, as a dict's
            index = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges])
            # Two threads reading one rank at once both make it; setdefault keeps one (atomic under the GIL).
            made = self._made.setdefault(rank, self._columns.rows(index))
        return made

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


class Tasks(Sequence[Task]):
    """An iteration's tasks, also grouped by rank the way the timeline draws them, so a redraw never regroups.

    As a sequence: every task, in the order the analysis lists them (compute lanes, then each rank's collectives).
    ``by_rank`` holds each rank's tasks in that same order and ``lanes`` the lanes they ran on; ``end_ns`` is the
    latest task end. Never changed after it is built (the tasks are made on first read, once).

    >>> ts = Tasks([Task(1, "io", "load", "next", "main", 0, 5), Task(0, "compute", "forward", "net", "gpu", 5, 9),
    ...             Task(1, "allreduce", "allreduce", "bucket 0", "comm", 5, 7)])
    >>> [t.name for t in ts.by_rank[1]], ts.lanes, ts.end_ns
    (['next', 'bucket 0'], {1: ('main', 'comm'), 0: ('gpu',)}, 9)
    """

    __slots__ = ("_all", "_columns", "_rows", "by_rank", "end_ns", "lanes")

    by_rank: Mapping[int, tuple[Task, ...]]
    """Rank → its tasks, in the sequence's order."""
    lanes: Mapping[int, tuple[str, ...]]
    """Rank → the lanes its tasks ran on (each once)."""
    end_ns: int | None
    """The latest task end (None without tasks)."""

    def __init__(self, tasks: Iterable[Task] = ()) -> None:
        """The tasks given, grouped here."""
        self._all: tuple[Task, ...] | None = tuple(tasks)
        self._columns: TaskColumns | None = None
        self._rows: Mapping[int, Sequence[tuple[int, int]]] = {}
        grouped: dict[int, list[Task]] = {}
        for t in self._all:
            grouped.setdefault(t.rank, []).append(t)
        self.by_rank = {r: tuple(ts) for r, ts in grouped.items()}
        self.lanes = {r: tuple(dict.fromkeys(t.lane for t in ts)) for r, ts in grouped.items()}
        self.end_ns = max((t.end_ns for t in self._all), default=None)

    @classmethod
    def of_columns(cls, columns: TaskColumns, rows: Mapping[int, Sequence[tuple[int, int]]],
                   lanes: Mapping[int, tuple[str, ...]]) -> Tasks:
        """The tasks in ``columns``, each rank's in the row ranges ``rows[rank]`` (``(lo, hi)``, in order, not
        empty), made when read."""
        self = cls.__new__(cls)
        self._all, self._columns, self._rows = None, columns, rows
        self.by_rank = _ByRank(columns, rows)
        self.lanes = lanes
        self.end_ns = int(columns.end_ns.max()) if len(columns) else None
        return self

    def last_end_by_rank(self) -> dict[int, int]:
        """Rank → the end of its latest task, without making the tasks."""
        if self._columns is None:
            return {r: max(t.end_ns for t in ts) for r, ts in self.by_rank.items() if ts}
        end, rows = self._columns.end_ns, self._rows
        return {r: max(int(end[lo:hi].max()) for lo, hi in ranges) for r, ranges in rows.items()}

    def _tasks(self) -> tuple[Task, ...]:
        if self._all is None:
            assert self._columns is not None
            self._all = self._columns.rows(slice(None))
        return self._all

    def __len__(self) -> int:
        return len(self._columns) if self._columns is not None else len(self._tasks())

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Task, ...]: ...

    def __getitem__(self, i: int | slice) -> Task | tuple[Task, ...]:
        return self._tasks()[i]

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Tasks):
            return self._tasks() == other._tasks()
        return isinstance(other, tuple) and self._tasks() == other

    def __hash__(self) -> int:
        return hash(self._tasks())

    def __repr__(self) -> str:
        return f"Tasks({len(self)} tasks, {len(self.by_rank)} ranks)"


NO_TASKS = Tasks()
"""The tasks of an analysis that gave them up (the pipeline's task budget) or never had them."""
