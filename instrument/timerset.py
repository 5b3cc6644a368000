"""The timers of one granularity grouped (:class:`TimerSet`): the units' own timer and one per level of spans
around them, hooked, flushed and removed together."""

from __future__ import annotations

from torch import nn

from instrument.events import RawEvent
from instrument.probe import Probe
from instrument.timing import UnitTimer
from instrument.unit import Boundaries, Unit


class TimerSet:
    """The timed units of one granularity and the spans around them (instrument/spans.py), hooked, flushed
    and removed together: the units' own timer, then one timer per level of spans (they must not nest)."""

    def __init__(self, units: UnitTimer, spans: list[UnitTimer]) -> None:
        self.timers = [units, *spans]

    @classmethod
    def of(cls, units: list[tuple[str, nn.Module]], levels: list[list[tuple[str, nn.Module]]],
           events: list[RawEvent], probe: Probe) -> TimerSet:
        """The timers of ``units`` and of their span ``levels``, their events appended to ``events`` by
        ``probe.sink``."""
        from instrument.spans import SPAN

        shared: Boundaries = {}
        spans = probe.on_lane(SPAN + probe.lane)
        return cls(UnitTimer(units, events, probe, shared), [UnitTimer(level, events, spans, shared) for level in levels])

    @property
    def units(self) -> list[Unit]:
        return self.timers[0].units

    @property
    def installed(self) -> bool:
        return self.timers[0].installed

    def install(self) -> None:
        for timer in self.timers:
            timer.install()

    def remove(self) -> None:
        for timer in self.timers:
            timer.remove()

    def flush(self) -> None:
        for timer in self.timers:
            timer.flush()
