"""The status line: where the frames come from, ranks, iteration, rate, lag and anything lost."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import Snapshot
from dagtop.ui.palette import STRAGGLER_COLOUR

_SEP = " │ "


def job_ended(snapshot: Snapshot, live: bool, job_exited: bool = False) -> bool:
    """True once nothing more will come: the job started for the demo exited, every rank that ever spoke said
    goodbye, or the recording was read to its end. The last rate measured is then stale."""
    if job_exited or snapshot.finished:
        return True
    return live and bool(snapshot.ranks) and not any(r.connected for r in snapshot.ranks)


def status_text(snapshot: Snapshot, *, source: str, live: bool, lag_s: float | None, paused: bool,
                shown_iteration: int | None, job_exited: bool = False, refused: int = 0) -> Text:
    """One line; ``lag_s`` is None in replay, where lag means nothing.

    Args:
        source: ``live tcp://…`` or ``replay FILE``, as the user named it.
        shown_iteration: the iteration the panels show (an older one while paused and browsing).
        job_exited: the job the screen started (``dagtop demo``) has exited.
        refused: connections the monitor's ``--auth`` refused (a rank with a wrong key or none); shown when any.
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
    if job_ended(snapshot, live, job_exited):
        text.append(f"{_SEP}— it/s · {'job' if live else 'replay'} ended", style="bold")
    elif snapshot.liveness.stalled_s:  # the rate of the last iterations would say the job still runs
        text.append(f"{_SEP}0 it/s · stalled {snapshot.liveness.stalled_s:.0f} s", style=f"bold {STRAGGLER_COLOUR}")
    else:
        text.append(f"{_SEP}{snapshot.iterations_per_s:.1f} it/s")
    if lag_s is not None:
        text.append(f"{_SEP}lag {lag_s:.2f} s", style=STRAGGLER_COLOUR if lag_s > 2.0 else "")
    lost = Text(f"{_SEP}dropped {snapshot.dropped} · rejected {snapshot.rejected}")
    if snapshot.dropped or snapshot.rejected or snapshot.incomplete or refused:
        lost.stylize(STRAGGLER_COLOUR)
    if snapshot.incomplete:
        lost.append(f" · incomplete {snapshot.incomplete}")
    if refused:
        lost.append(f" · refused {refused}", style=STRAGGLER_COLOUR)
    text.append_text(lost)
    text.append(f"{_SEP}{source}", style="dim")
    return text
