"""Clock alignment across hosts: per-host offsets estimated from the instants the collectives end."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence

from instrument.events import LANE_CODE, Event, EventColumns
from instrument.wire import Hello

_COMM = LANE_CODE["comm"]

HISTORY = 32
"""Per-iteration estimates kept per host; the offset is their median (robust to one odd iteration)."""


class ClockAligner:
    """Offsets (ns) that put each rank's monotonic clock on the clock of the reference host.

    Ranks on one host share CLOCK_MONOTONIC, so offsets are per host. The reference is the host of the
    lowest rank. Until collectives are seen, the hello's wall/monotonic pair gives a first guess (good to
    NTP error); after that each iteration contributes the median, over its collectives, of (end on a
    reference-host rank − end on this host's rank): a collective ends at nearly the same instant everywhere.
    """

    def __init__(self) -> None:
        self.host: dict[int, str] = {}
        self._wall_minus_mono: dict[str, int] = {}
        self._history: dict[str, deque[int]] = {}
        self._spread: dict[str, int] = {}

    def hello(self, h: Hello) -> None:
        self.host[h.rank] = h.host
        self._wall_minus_mono[h.host] = h.wall_ns - h.mono_ns

    @property
    def reference(self) -> str | None:
        return self.host[min(self.host)] if self.host else None

    @property
    def multi_host(self) -> bool:
        return len(set(self.host.values())) > 1

    def offset(self, rank: int) -> int:
        ref = self.reference
        host = self.host.get(rank, ref)
        if host is None or host == ref or ref is None:
            return 0
        hist = self._history.get(host)
        if hist:
            return int(statistics.median(hist))
        if host in self._wall_minus_mono and ref in self._wall_minus_mono:
            return self._wall_minus_mono[host] - self._wall_minus_mono[ref]
        return 0

    def offsets(self, ranks: Sequence[int]) -> dict[int, int]:
        return {r: self.offset(r) for r in ranks}

    def observe(self, events: Mapping[int, Sequence[Event]]) -> None:
        """Refine the offsets from one iteration's collective end times."""
        ref = self.reference
        if ref is None or not self.multi_host:
            return
        ends: dict[str, dict[str, list[int]]] = {}
        for r, evs in events.items():
            host = self.host.get(r, ref)
            per = ends.setdefault(host, {})
            columns = EventColumns.of(evs)
            for lane, name, end in zip(columns.lane, columns.name, columns.end_ns):
                if lane == _COMM:
                    per.setdefault(name, []).append(end)
        ref_ends = ends.get(ref)
        if not ref_ends:
            return
        for host, per in ends.items():
            if host == ref:
                continue
            diffs = [statistics.median(ref_ends[n]) - statistics.median(t) for n, t in per.items() if n in ref_ends]
            if diffs:
                self._history.setdefault(host, deque(maxlen=HISTORY)).append(int(statistics.median(diffs)))
                self._spread[host] = int(max(diffs) - min(diffs))

    def notes(self) -> tuple[str, ...]:
        """One line per host that is not the reference: its estimated offset and how it was found."""
        ref = self.reference
        if ref is None or not self.multi_host:
            return ()
        out = []
        for host in sorted(set(self.host.values()) - {ref}):
            rank = min(r for r, h in self.host.items() if h == host)
            off = self.offset(rank) / 1e6
            hist = self._history.get(host)
            how = (f"from {len(hist)} iterations of collective end times, spread {self._spread.get(host, 0) / 1e3:.0f} µs"
                   if hist else "from the hello's wall clock only (no collective seen yet)")
            out.append(f"clock of {host} is {off:+.3f} ms from {ref}'s ({how})")
        return tuple(out)
