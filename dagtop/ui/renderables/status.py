"""The status line: where the frames come from, ranks, iteration, rate, lag and anything lost."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import Snapshot
from dagtop.ui.palette import STRAGGLER_COLOUR

_SEP = " │ "


def status_text(snapshot: Snapshot, *, source: str, live: bool, lag_s: float | None, paused: bool,
                shown_iteration: int | None) -> Text:
    """One line; ``lag_s`` is None in replay, where lag means nothing.

    Args:
        source: ``live tcp://…`` or ``replay FILE``, as the user named it.
        shown_iteration: the iteration the panels show (an older one while paused and browsing).
    """
    text = Text()
    text.append("dagtop", style="bold")
    if paused:
        text.append(" ")
        text.append(" PAUSED ", style="bold reverse")
    if live:
        connected = sum(1 for r in snapshot.ranks if r.connected)
        text.append(f"{_SEP}ranks {connected}/{snapshot.ranks_expected or '?'}")
    else:
        text.append(f"{_SEP}ranks {len(snapshot.ranks)}/{snapshot.ranks_expected or '?'}")
    latest = snapshot.latest.iteration if snapshot.latest else None
    if latest is None:
        text.append(f"{_SEP}no iteration yet")
    elif shown_iteration is not None and shown_iteration != latest:
        text.append(f"{_SEP}iteration {shown_iteration} of {latest}")
    else:
        text.append(f"{_SEP}iteration {latest}")
    text.append(f"{_SEP}{snapshot.iterations_per_s:.1f} it/s")
    if lag_s is not None:
        text.append(f"{_SEP}lag {lag_s:.2f} s", style=STRAGGLER_COLOUR if lag_s > 2.0 else "")
    lost = Text(f"{_SEP}dropped {snapshot.dropped} · rejected {snapshot.rejected}")
    if snapshot.dropped or snapshot.rejected or snapshot.incomplete:
        lost.stylize(STRAGGLER_COLOUR)
    if snapshot.incomplete:
        lost.append(f" · incomplete {snapshot.incomplete}")
    text.append_text(lost)
    text.append(f"{_SEP}{source}", style="dim")
    if not live and snapshot.finished:
        text.append(" (end)", style="dim")
    return text
