"""The headline verdict (the steady one over recent iterations, then the latest) and the critical-path bar."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import GATHER, IterationAnalysis, SteadyVerdict
from dagtop.ui.palette import STRAGGLER_COLOUR, colour, label
from dagtop.ui.renderables.fit import fit_line


def headline(steady: SteadyVerdict | None, analysis: IterationAnalysis, width: int | None = None) -> Text:
    """What held over the recent window first, then the iteration on screen, in at most ``width`` cells::

        io on the critical path 78 % (last 20) · straggler rank 1 (io +122 ms [118, 127]) │ it 55: io 81 % · …

    Until the window has :data:`~dagtop.model.snapshot.GATHER` iterations past warm-up it says so instead of a
    verdict (``gathering: 3 of 10 iterations past warm-up``). Two categories within the window's spread are a tie
    (``compute ≈ all-reduce (41 % / 38 %)``). The straggler is the one :mod:`dagtop.model.straggler` names: its
    time in the category it was named in over the other ranks' median, the median over the window and its 95 %
    interval. Where the line does not fit, its words shorten before a figure goes (issue #30): the lead's words,
    then the interval, the exposed figure, the window, the word "rank"; the iteration's own share stays (80
    columns)::

        io 78 % (last 20) · straggler rank 1 (io +122 ms) │ it 55: io 81 %
    """
    incomplete = [Text("incomplete: a rank's events are missing · ", style=STRAGGLER_COLOUR),
                  Text("incomplete · ", style=STRAGGLER_COLOUR)] if not analysis.complete else []
    iteration = _iteration(analysis)
    if steady is None or steady.gathering:
        gathering = f"gathering: {steady.iterations if steady else 0} of {GATHER} iterations"
        lead = [Text(f"{gathering} past warm-up", style="bold"), Text(gathering, style="bold")]
        return fit_line([incomplete, lead, iteration], (1, 2, 0), width if width is not None else 10**6)
    window = f"last {steady.iterations}"
    if steady.tied_with is not None:
        tie = Text.assemble((label(steady.bottleneck), f"bold {colour(steady.bottleneck)}"), (" ≈ ", "bold"),
                            (label(steady.tied_with), f"bold {colour(steady.tied_with)}"))
        shares = f" ({steady.share * 100:.0f} % / {steady.tied_share * 100:.0f} %"
        lead = [Text.assemble(tie, (f"{shares}, {window})", "bold")), Text.assemble(tie, (f"{shares})", "bold"))]
    else:
        share = f"{steady.share * 100:.0f} %"
        lead = [_bottleneck(steady.bottleneck, words, style="bold")
                for words in (f" on the critical path {share} ({window})", f" {share} of critical path ({window})",
                              f" {share} of path ({window})", f" {share} ({window})", f" {share}")]
    st = steady.straggler
    if st is None:
        straggler = [Text(" · no straggler")]
    else:
        lo, hi = st.excess_range_ms
        straggler = [Text(" · ").append_text(_straggler(who, st.category, st.excess_ms, tail))
                     for who, tail in ((f"rank {st.rank}", f" [{lo:.0f}, {hi:.0f}]"), (f"rank {st.rank}", ""),
                                       (f"r{st.rank}", ""))]
    # Give way: the lead's words, the interval, the exposed figure, the window, the word "rank".
    order = (1, 1, 1, 2, 3, 1, 2, 0)
    return fit_line([incomplete, lead, straggler, iteration], order, width if width is not None else 10**6)


def _iteration(analysis: IterationAnalysis) -> list[Text]:
    """`` │ it 55: compute 81 % · exposed 12 ms``, dim, and its shorter form: the iteration on screen, after the
    window's verdict."""
    now = Text(f" │ it {analysis.iteration}: ", style="dim")
    if analysis.stalled:
        return [now + Text("stalled (left out of the verdict)", style="dim"), now + Text("stalled", style="dim")]
    share = Text.assemble(now, (label(analysis.bottleneck), colour(analysis.bottleneck)),
                          (f" {analysis.shares.get(analysis.bottleneck, 0.0) * 100:.0f} %", "dim"))
    return [share + Text(f" · {_communication(analysis)}", style="dim"), share]


def _bottleneck(category: str, words: str, style: str) -> Text:
    """``io on the critical path 78 %``: the category in its colour, then ``words``."""
    return Text.assemble((label(category), f"{style} {colour(category)}"), (words, style))


def _straggler(rank: str, category: str, excess_ms: float, tail: str) -> Text:
    """``straggler rank 1 (io +122 ms…)``: the rank in red, the category in its colour."""
    return Text.assemble((f"straggler {rank}", f"bold {STRAGGLER_COLOUR}"), " (",
                         (label(category), colour(category)), f" {excess_ms:+.0f} ms{tail})")


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


