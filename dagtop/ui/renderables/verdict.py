"""The one-line verdict for an iteration and its critical path as a proportional bar."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from rich.text import Text

from dagtop.model.snapshot import IterationAnalysis
from dagtop.ui.palette import STRAGGLER_COLOUR, colour, label


def verdict_line(analysis: IterationAnalysis) -> str:
    """``all-reduce on the critical path 46 % · exposed 38 ms · straggler rank 3 (io +21 ms)``."""
    share = analysis.shares.get(analysis.bottleneck, 0.0)
    parts = [f"{label(analysis.bottleneck)} on the critical path {share * 100:.0f} %",
             f"exposed {analysis.exposed_comm_ms:.0f} ms"]
    s = analysis.straggler
    parts.append(f"straggler rank {s.rank} ({label(s.category)} {s.excess_ms:+.0f} ms)" if s else "no straggler")
    if not analysis.complete:
        parts.insert(0, "incomplete: a rank's events are missing")
    return " · ".join(parts)


def verdict_text(analysis: IterationAnalysis) -> Text:
    """:func:`verdict_line` with the bottleneck in its colour and the straggler in red."""
    text = Text()
    if not analysis.complete:
        text.append("incomplete: a rank's events are missing", style=STRAGGLER_COLOUR)
        text.append(" · ")
    share = analysis.shares.get(analysis.bottleneck, 0.0)
    text.append(label(analysis.bottleneck), style=f"bold {colour(analysis.bottleneck)}")
    text.append(f" on the critical path {share * 100:.0f} %", style="bold")
    text.append(f" · exposed {analysis.exposed_comm_ms:.0f} ms · ")
    s = analysis.straggler
    if s is None:
        text.append("no straggler")
    else:
        text.append(f"straggler rank {s.rank}", style=f"bold {STRAGGLER_COLOUR}")
        text.append(" (")
        text.append(label(s.category), style=colour(s.category))
        text.append(f" {s.excess_ms:+.0f} ms)")
    return text


def critical_path_bar(analysis: IterationAnalysis, width: int) -> Text:
    """The critical path in execution order, each stretch as wide as its share of the path, in its colour.

    Consecutive stretches of one category merge; a stretch too short for a cell is carried over
    (largest remainders), so the bar is exactly ``width`` cells whenever the path is not empty.
    """
    runs: list[tuple[str, float]] = []
    for seg in analysis.critical_path:
        ms = max(0.0, seg.duration_ms)
        if runs and runs[-1][0] == seg.category:
            runs[-1] = (seg.category, runs[-1][1] + ms)
        else:
            runs.append((seg.category, ms))
    total = sum(ms for _, ms in runs)
    if total <= 0 or width <= 0:
        return Text(" " * max(width, 0))
    exact = [ms / total * width for _, ms in runs]
    cells = [int(x) for x in exact]
    by_remainder = sorted(range(len(runs)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in by_remainder[: width - sum(cells)]:
        cells[i] += 1
    text = Text()
    for (category, _), n in zip(runs, cells):
        if n:
            text.append("█" * n, style=colour(category))
    return text


RECENT = 20
"""Iterations the steady verdict looks back over: one iteration's verdict flickers where two categories are close."""


class Recent(NamedTuple):
    """The verdict over the last few iterations."""

    category: str
    """The category holding the most critical-path time."""
    share: float
    iterations: int
    straggler: tuple[int, int] | None = None
    """(rank, iterations it was the straggler in): the most frequent one, if any iteration had one."""


def recent_bottleneck(analyses: Sequence[IterationAnalysis], upto: int, n: int = RECENT) -> Recent | None:
    """The category holding the most critical-path time over the last ``n`` complete iterations up to ``upto``,
    and the rank most often the straggler among them.

    Iteration 0 (warm-up) is left out when there are others. None with fewer than two iterations.
    """
    chosen = [a for a in analyses if a.iteration <= upto and a.complete and a.measured_ms > 0]
    chosen = ([a for a in chosen if a.iteration >= 1] or chosen)[-n:]
    if len(chosen) < 2:
        return None
    totals: dict[str, float] = {}
    for a in chosen:
        for category, share in a.shares.items():
            totals[category] = totals.get(category, 0.0) + share * a.measured_ms
    whole = sum(totals.values())
    if whole <= 0:
        return None
    category = max(totals, key=lambda c: totals[c])
    late = Counter(a.straggler.rank for a in chosen if a.straggler is not None).most_common(1)
    return Recent(category, totals[category] / whole, len(chosen), late[0] if late else None)


def recent_text(recent: Recent | None) -> Text:
    """`` · last 20: all-reduce 52 %`` and, if some iteration had a straggler, ``, rank 1 late 3/20``: a rank late
    now and then is noise on a busy machine, a rank late every time is the thing to fix."""
    if recent is None:
        return Text("")
    text = Text(f" · last {recent.iterations}: ", style="dim")
    text.append(label(recent.category), style=colour(recent.category))
    text.append(f" {recent.share * 100:.0f} %", style="dim")
    if recent.straggler is not None:
        rank, count = recent.straggler
        steady = count * 2 > recent.iterations
        text.append(", ", style="dim")
        text.append(f"rank {rank} late {count}/{recent.iterations}",
                    style=f"bold {STRAGGLER_COLOUR}" if steady else "dim")
    return text
