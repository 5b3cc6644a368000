"""What the panels draw at one instant: a snapshot, the iteration chosen from it, and the user's focus."""

from __future__ import annotations

from dataclasses import dataclass

from dagtop.model.snapshot import EMPTY_SNAPSHOT, IterationAnalysis, Snapshot


@dataclass(frozen=True, slots=True)
class View:
    """Immutable, so a widget can keep it and redraw from it at any size."""

    snapshot: Snapshot
    analysis: IterationAnalysis | None
    """The iteration shown: the latest, or the one browsed to while paused."""
    focus_rank: int | None = None
    paused: bool = False
    waiting_hint: str = ""
    """What to tell the user while no iteration has arrived (where the ranks must publish to)."""


EMPTY_VIEW = View(EMPTY_SNAPSHOT, None)
