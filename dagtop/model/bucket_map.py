"""The gradient buckets as DDP makes them, and a backward as they see it: DDP's bucketing rule, the parameters in
the order their gradients became ready with the timed block each belongs to (:class:`Layout`), and each iteration's
backward with its bucket all-reduces (:class:`Backward`), each credited its share of the channel (:func:`shares`).
:mod:`dagtop.model.buckets` schedules and regroups them.

DDP puts the parameters, in the order their gradients became ready in the previous iteration, into buckets: a
bucket is closed once its bytes reach its limit (1 MiB for the first and 25 MiB for the rest by default;
``bucket_cap_mb=X`` makes every limit X MiB, ``bucket_cap_mb_list`` gives one per bucket, the last repeated).

    >>> ddp_buckets([4, 4, 4, 4], [6])  # parameters per bucket: 4+4 reaches 6, then the next two
    [2, 2]
    >>> ddp_buckets([1, 1, 1, 1, 1], [1, 2])  # the first limit, then the last one repeated
    [1, 2, 2]
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from dagtop.model.allreduce import Observed
from dagtop.model.snapshot import IterationAnalysis
from instrument.wire import Buckets

MIB = 1 << 20
DEFAULT_LIMITS = (1 * MIB, 25 * MIB)
"""DDP's bucket limits when ``bucket_cap_mb`` is not given: a 1 MiB first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``),
then 25 MiB. An explicit ``bucket_cap_mb=25`` is not the same: its first bucket is 25 MiB too."""

RANKS_READ = 8
"""Ranks whose backward is read per iteration: those that gated a bucket, the lowest rank first."""


def ddp_buckets(sizes: Sequence[int], limits: Sequence[int]) -> list[int]:
    """Parameters per bucket as DDP's reducer fills them (``compute_bucket_assignment_by_size``, one dtype): in
    order, a bucket closes once its bytes reach its limit; limits are taken in turn, the last one repeated."""
    counts: list[int] = []
    n = total = 0
    for size in sizes:
        n, total = n + 1, total + size
        if total >= limits[min(len(counts), len(limits) - 1)]:
            counts.append(n)
            n = total = 0
    if n:
        counts.append(n)
    return counts


def totals(sizes: Sequence[int], counts: Sequence[int]) -> list[int]:
    """Bytes per bucket of a grouping (parameters per bucket) of ``sizes``."""
    out, at = [], 0
    for n in counts:
        out.append(sum(sizes[at:at + n]))
        at += n
    return out


@dataclass(frozen=True, slots=True)
class Layout:
    """The gradients in the order DDP buckets them (the order they became ready), each with its bytes and the timed
    block whose backward produces it, and the buckets now as parameters per bucket."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    blocks: tuple[str, ...]
    """The timed unit each parameter belongs to (the longest unit name that prefixes it), "" where none does."""
    now: tuple[int, ...]
    _ready: dict[int, tuple[Backward, npt.NDArray[np.float64]]] = field(default_factory=dict, compare=False,
                                                                        repr=False)

    @classmethod
    def of(cls, frame: Buckets, units: Sequence[str]) -> Layout | None:
        """The layout of a rank's bucket map; None without parameters' bytes (a shim older than them, or names
        it could not tell)."""
        if not frame.parameter_bytes:
            return None
        ordered = sorted(frame.buckets, key=lambda b: b.index)
        by_index = {b.index: s for b, s in zip(frame.buckets, frame.parameter_bytes)}
        names = tuple(n for b in ordered for n in b.parameters)
        sizes = tuple(s for b in ordered for s in by_index[b.index])
        longest = sorted(set(units), key=len, reverse=True)
        blocks = tuple(next((u for u in longest if n == u or n.startswith(u + ".")), "") for n in names)
        return cls(names, sizes, blocks, tuple(len(b.parameters) for b in ordered))

    def ready_ns(self, b: Backward) -> npt.NDArray[np.float64]:
        """When each parameter's gradient is ready in backward ``b``: its block's backward end (the backward's end
        for a parameter of no timed block). Kept per backward: every grouping tried reads it."""
        key = id(b)
        cached = self._ready.get(key)
        if cached is None or cached[0] is not b:
            ready = np.array([b.ready.get(blk, b.end) if blk else b.end for blk in self.blocks], dtype=np.float64)
            cached = self._ready[key] = (b, ready)
        return cached[1]

    @property
    def mapped(self) -> float:
        """Share of the bytes whose block is timed."""
        whole = sum(self.sizes)
        return sum(s for s, b in zip(self.sizes, self.blocks) if b) / whole if whole else 0.0

    def counts(self, limits: Sequence[int]) -> tuple[int, ...]:
        return tuple(ddp_buckets(self.sizes, limits))


@dataclass(frozen=True, slots=True)
class Backward:
    """One iteration's backward as the buckets see it (ns on the common clock): when each block's gradients were
    ready on the slowest rank read, when the backward ended there, and the bucket all-reduces observed."""

    iteration: int
    ready: Mapping[str, int]
    end: int
    observed_end: int
    """The end of the last bucket all-reduce observed (``end`` if it ended earlier)."""
    identity_ms: float
    """The iteration as the DAG replays it: the base a change's prediction is taken off."""
    collectives: tuple[tuple[int, int, int], ...] = ()
    """The bucket all-reduces observed, (bytes, start, end) in time order, each as long as its share of the channel
    (:func:`shares`), as the schedule has them: one at a time."""

    def observed(self) -> list[Observed]:
        """The all-reduces as :func:`dagtop.model.allreduce.fit` takes them."""
        return [(m, s, e, self.end) for m, s, e in self.collectives]


def backward_of(a: IterationAnalysis, together: int = 1) -> Backward | None:
    """The backward of one analysed iteration, read from its tasks on the ranks that gated its buckets; None
    without tasks or without bucket all-reduces. ``together``: how many all-reduces the job's process group runs at
    once (:func:`shares`); with 1 each starts once the one before it ended."""
    buckets = [c for c in a.collectives if c.name.startswith("bucket ")]
    if not buckets or not len(a.tasks):
        return None
    ranks = list(dict.fromkeys([min(a.ranks), *(c.gating_rank for c in buckets)]))[:RANKS_READ]
    ready: dict[str, int] = {}
    end = 0
    for r in ranks:
        for t in a.tasks.by_rank.get(r, ()):
            if t.phase == "backward" and t.lane != "comm":
                ready[t.name] = max(ready.get(t.name, 0), t.end_ns)
                end = max(end, t.end_ns)
    if not ready:
        return None
    # Each from its latest rank's hand-over (the DAG's start_ns is already cut to the channel, one at a time).
    spans = sorted(((c.bytes, max(c.ready_ns.values(), default=c.start_ns), c.end_ns) for c in buckets),
                   key=lambda c: c[1])
    return Backward(a.iteration, ready, end, max(end, max(c.end_ns for c in buckets)), a.predicted_ms,
                    shares(spans, together))


GLOO_TOGETHER: Final = 2
"""All-reduces gloo's process group runs at once: its two worker threads (``ProcessGroupGloo``'s default of two
per device). NCCL runs DDP's buckets one after another on its stream."""


def together_on(devices: Sequence[str]) -> int:
    """How many bucket all-reduces run at once on ranks of these devices: :data:`GLOO_TOGETHER` where every rank is
    on the CPU (gloo), else one (NCCL's stream, and nothing known)."""
    return GLOO_TOGETHER if devices and all(d == "cpu" for d in devices) else 1


def shares(spans: Sequence[tuple[int, int, int]], together: int = 1) -> tuple[tuple[int, int, int], ...]:
    """Each all-reduce of ``spans`` ((bytes, handed over, end), by hand-over) as (bytes, end − its share, end): the
    time it had the channel, as the schedule has them, one after another.

    With ``together`` 1 the process group runs one at a time and a bucket handed over while another is in flight
    waits: its share starts where the one before it ended. Gloo runs two at a time: they share the link and the
    cores, each going at a fraction of its speed alone, and each is credited the time it ran alone plus an equal
    part of the time it ran beside another (a third waits until one of them ends). Cut at the end of the one before
    it instead, as if they had run one after the other, the first looks slow and the second quick: over a 1 Gbit/s
    link a 28 MiB bucket took 348 ms and the 24 MiB one after it 106 ms where each alone took 245 and 210 ms; the
    fit read the first's slowness as a stretch under the backward (×7), and no smaller bucket looked worth having.
    Shared, they are credited 238 and 215 ms, and the two still fill the channel from the first's start to the
    second's end.

        >>> shares([(1, 0, 10), (1, 6, 20)])  # together 1: the second waits until 10
        ((1, 0, 10), (1, 10, 20))
        >>> shares([(1, 0, 10), (1, 6, 20)], together=2)  # 6 alone + 4 shared; 4 shared + 10 alone
        ((1, 2, 10), (1, 8, 20))
    """
    if together <= 1:
        out, channel = [], 0
        for m, s, e in spans:
            start = max(s, channel)
            out.append((m, start, max(e, start)))
            channel = max(channel, e)
        return tuple(out)
    bounds = sorted({t for _, s, e in spans for t in (s, e)})
    work = [0.0] * len(spans)
    for lo, hi in itertools.pairwise(bounds):
        running = [i for i, (_, s, e) in enumerate(spans) if s <= lo and e >= hi][:together]
        for i in running:
            work[i] += (hi - lo) / len(running)
    return tuple((m, e - round(w), e) for (m, _, e), w in zip(spans, work))

