"""The headline verdict (the steady one over recent iterations, then the latest) and the critical-path bar."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import GATHER, IterationAnalysis, SteadyVerdict
from dagtop.ui.palette import STRAGGLER_COLOUR, colour, label

NARROW = 100
"""Below this many columns the headline uses its short form, so that the straggler still fits."""


def headline(steady: SteadyVerdict | None, analysis: IterationAnalysis, width: int = NARROW) -> Text:
    """What held over the recent window first, then the iteration on screen::

        io on the critical path 78 % (last 20) · straggler rank 1 (io +122 ms [118, 127]) │ it 55: io 81 % · …

    Until the window has :data:`~dagtop.model.snapshot.GATHER` iterations past warm-up it says so instead of a
    verdict (``gathering: 3 of 10 iterations past warm-up``). Two categories within the window's spread are a tie
    (``compute ≈ all-reduce (41 % / 38 %)``). The straggler is the one :mod:`dagtop.model.straggler` names: its
    time in the category it was named in over the other ranks' median, the median over the window and its 95 %
    interval. Narrower than
    ``NARROW`` the interval and some words go::

        io 78 % of critical path (last 20) · straggler rank 1 (io +122 ms) │ it 55: …
    """
    text = Text()
    if not analysis.complete:
        text.append("incomplete: a rank's events are missing", style=STRAGGLER_COLOUR)
        text.append(" · ")
    narrow = width < NARROW
    if steady is None or steady.gathering:
        text.append(f"gathering: {steady.iterations if steady else 0} of {GATHER} iterations", style="bold")
        if not narrow:
            text.append(" past warm-up", style="bold")
        _iteration(text, analysis)
        return text
    if steady.tied_with is not None:
        text.append(label(steady.bottleneck), style=f"bold {colour(steady.bottleneck)}")
        text.append(" ≈ ", style="bold")
        text.append(label(steady.tied_with), style=f"bold {colour(steady.tied_with)}")
        text.append(f" ({steady.share * 100:.0f} % / {steady.tied_share * 100:.0f} %", style="bold")
        text.append(f", last {steady.iterations})" if not narrow else ")", style="bold")
    else:
        text.append(label(steady.bottleneck), style=f"bold {colour(steady.bottleneck)}")
        share = f"{steady.share * 100:.0f} %"
        text.append(f" {share} of critical path" if narrow else f" on the critical path {share}", style="bold")
        text.append(f" (last {steady.iterations})", style="bold")
    text.append(" · ")
    st = steady.straggler
    if st is None:
        text.append("no straggler")
    else:
        text.append(f"straggler rank {st.rank}", style=f"bold {STRAGGLER_COLOUR}")
        text.append(" (")
        text.append(label(st.category), style=colour(st.category))
        lo, hi = st.excess_range_ms
        text.append(f" {st.excess_ms:+.0f} ms" + ("" if narrow else f" [{lo:.0f}, {hi:.0f}]") + ")")
    _iteration(text, analysis)
    return text


def _iteration(text: Text, analysis: IterationAnalysis) -> None:
    """`` │ it 55: compute 81 % · exposed 12 ms``, dim: the iteration on screen, after the window's verdict."""
    text.append(f" │ it {analysis.iteration}: ", style="dim")
    if analysis.stalled:
        text.append("stalled (left out of the verdict)", style="dim")
        return
    text.append(label(analysis.bottleneck), style=colour(analysis.bottleneck))
    text.append(f" {analysis.shares.get(analysis.bottleneck, 0.0) * 100:.0f} % · {_communication(analysis)}",
                style="dim")


def _communication(analysis: IterationAnalysis) -> str:
    """Exposed communication, or that there was none to see: several ranks and no collective timed (no DDP)."""
    if len(analysis.ranks) > 1 and not analysis.collectives:
        return "no comm seen"
    return f"exposed {analysis.exposed_comm_ms:.0f} ms"


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


