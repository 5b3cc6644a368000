"""The status line: where the frames come from, ranks, iteration, rate, lag and anything lost."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import Snapshot
from dagtop.ui.palette import STRAGGLER_COLOUR
from dagtop.ui.renderables.fit import fit_line

_SEP = " │ "


def job_ended(snapshot: Snapshot, live: bool, job_exited: bool = False) -> bool:
    """True once nothing more will come: the job started for the demo exited, every rank that ever spoke said
    goodbye, or the recording was read to its end. The last rate measured is then stale."""
    if job_exited or snapshot.finished:
        return True
    return live and bool(snapshot.ranks) and not snapshot.running


def status_text(snapshot: Snapshot, *, source: str, live: bool, lag_s: float | None, paused: bool,
                shown_iteration: int | None, job_exited: bool = False, refused: int = 0,
                ended_at: str | None = None, width: int | None = None) -> Text:
    """One line of at most ``width`` cells; ``lag_s`` is None in replay, where lag means nothing.

    Where the line does not fit, the source is shortened, then words (``it 12/29``, ``rej 1``), then the source
    and the program's name go: the figures stay, and the line keeps its end.

    Args:
        source: ``live tcp://…``, ``replay FILE`` or ``demo …``, as the user would name it.
        shown_iteration: the iteration the panels show (an older one while paused and browsing).
        job_exited: the job the screen started (``dagtop demo``) has exited.
        refused: connections the monitor's ``--auth`` refused (a rank with a wrong key or none); shown when any.
        ended_at: the wall-clock time (``HH:MM:SS``) the ended job's last frame came; the lag is not shown then,
            as it would only grow.
        width: the cells there are; None: as wide as it comes.
    """
    name = Text("dagtop", style="bold")
    if paused:
        pause = Text(" PAUSED ", style="bold reverse")
        names = [Text.assemble(name, " ", pause), pause]
    else:
        names = [name, Text("")]
    connected = sum(1 for r in snapshot.ranks if r.connected) if live else len(snapshot.ranks)
    ranks = [Text(f"ranks {connected}/{snapshot.ranks_expected or '?'}")]
    latest = snapshot.latest.iteration if snapshot.latest else None
    if latest is None:
        iteration = [Text("no iteration yet"), Text("no it yet")]
    elif shown_iteration is not None and shown_iteration != latest:
        iteration = [Text(f"iteration {shown_iteration} of {latest}"), Text(f"it {shown_iteration}/{latest}")]
    else:
        iteration = [Text(f"iteration {latest}"), Text(f"it {latest}")]
    ended = job_ended(snapshot, live, job_exited)
    if ended:
        what = f"{'job' if live else 'replay'} ended" + (f" {ended_at}" if ended_at and live else "")
        rate = [Text(f"— it/s · {what}", style="bold"), Text(what, style="bold")]
    elif snapshot.liveness.stalled_s:  # the rate of the last iterations would say the job still runs
        stalled = f"stalled {snapshot.liveness.stalled_s:.0f} s"
        rate = [Text(f"0 it/s · {stalled}", style=f"bold {STRAGGLER_COLOUR}"),
                Text(stalled, style=f"bold {STRAGGLER_COLOUR}")]
    else:
        rate = [Text(f"{snapshot.iterations_per_s:.1f} it/s")]
    lag = [] if lag_s is None or (ended and live) else [
        Text(f"lag {lag_s:.2f} s", style=STRAGGLER_COLOUR if lag_s > 2.0 else "")]
    lost = [_losses(snapshot, refused, long) for long in (True, False)]
    kind, _, rest = source.partition(" ")
    sources = [Text(source, style="dim"), Text(rest or kind, style="dim"), Text("")]
    parts = [names, ranks, iteration, rate, lag, lost, sources]
    # Give way: the source's kind word, words (iteration, counters, rate), the source, the program's name.
    order = (6, 2, 5, 3, 6, 0)
    return fit_line(parts, order, width if width is not None else 10**6, sep=_SEP)


def _losses(snapshot: Snapshot, refused: int, long: bool) -> Text:
    """``dropped 3 · rejected 1 · incomplete 2 · refused 1``, or its short words: red when anything was lost."""
    words = ("dropped", "rejected", "incomplete", "refused") if long else ("drop", "rej", "incompl", "refused")
    lost = Text(f"{words[0]} {snapshot.dropped} · {words[1]} {snapshot.rejected}")
    if snapshot.dropped or snapshot.rejected or snapshot.incomplete or refused:
        lost.stylize(STRAGGLER_COLOUR)
    if snapshot.incomplete:
        lost.append(f" · {words[2]} {snapshot.incomplete}")
    if refused:
        lost.append(f" · {words[3]} {refused}", style=STRAGGLER_COLOUR)
    return lost
