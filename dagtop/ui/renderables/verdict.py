"""The headline verdict (the steady one over recent iterations, then the latest) and the critical-path bar."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import IterationAnalysis, SteadyVerdict
from dagtop.ui.palette import STRAGGLER_COLOUR, colour, label

NARROW = 100
"""Below this many columns the headline uses its short form, so that the straggler's count still fits."""


def headline(steady: SteadyVerdict | None, analysis: IterationAnalysis, width: int = NARROW) -> Text:
    """What held over the recent window first, then the iteration on screen::

        io on the critical path 78 % (last 20) · straggler rank 1 (io +122 ms, late 18/20) │ it 55: io 81 % · …

    Before there is a window (fewer than two iterations) the iteration's own verdict leads. The straggler's
    figure is its busy time over the other ranks' median, the ranks table's Δ busy. Narrower than ``NARROW``::

        io 78 % of critical path (last 20) · straggler rank 1 late 18/20 (io +122 ms) │ it 55: …
    """
    text = Text()
    if not analysis.complete:
        text.append("incomplete: a rank's events are missing", style=STRAGGLER_COLOUR)
        text.append(" · ")
    now_share = analysis.shares.get(analysis.bottleneck, 0.0)
    if steady is None:
        text.append(label(analysis.bottleneck), style=f"bold {colour(analysis.bottleneck)}")
        text.append(f" on the critical path {now_share * 100:.0f} %", style="bold")
        text.append(f" · {_communication(analysis)} · ")
        s = analysis.straggler
        if s is None:
            text.append("no straggler")
        else:
            _straggler(text, s.rank, s.category, s.busy_excess_ms, "")
        return text
    narrow = width < NARROW
    text.append(label(steady.bottleneck), style=f"bold {colour(steady.bottleneck)}")
    share = f"{steady.share * 100:.0f} %"
    text.append(f" {share} of critical path" if narrow else f" on the critical path {share}", style="bold")
    text.append(f" (last {steady.iterations})", style="bold")
    text.append(" · ")
    st = steady.straggler
    if st is None:
        text.append("no straggler")
    elif narrow:
        text.append(f"straggler rank {st.rank} late {st.late}/{steady.iterations}", style=f"bold {STRAGGLER_COLOUR}")
        text.append(" (")
        text.append(label(st.category), style=colour(st.category))
        text.append(f" {st.busy_excess_ms:+.0f} ms)")
    else:
        _straggler(text, st.rank, st.category, st.busy_excess_ms, f", late {st.late}/{steady.iterations}")
    text.append(f" │ it {analysis.iteration}: ", style="dim")
    text.append(label(analysis.bottleneck), style=colour(analysis.bottleneck))
    text.append(f" {now_share * 100:.0f} % · {_communication(analysis)}", style="dim")
    if analysis.straggler is not None:
        text.append(f" · rank {analysis.straggler.rank} late", style="dim")
    return text


def _communication(analysis: IterationAnalysis) -> str:
    """Exposed communication, or that there was none to see: several ranks and no collective timed (no DDP)."""
    if len(analysis.ranks) > 1 and not analysis.collectives:
        return "no comm seen"
    return f"exposed {analysis.exposed_comm_ms:.0f} ms"


def _straggler(text: Text, rank: int, category: str, busy_ms: float, tail: str) -> None:
    """``straggler rank 1 (io +122 ms…)``: the rank in red, the category in its colour."""
    text.append(f"straggler rank {rank}", style=f"bold {STRAGGLER_COLOUR}")
    text.append(" (")
    text.append(label(category), style=colour(category))
    text.append(f" {busy_ms:+.0f} ms{tail})")


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


