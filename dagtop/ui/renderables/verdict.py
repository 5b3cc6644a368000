"""The headline verdict (the steady one over recent iterations, then the latest) and the critical-path bar."""

from __future__ import annotations

from rich.text import Text

from dagtop.model.snapshot import IterationAnalysis, SteadyVerdict
from dagtop.ui.palette import STRAGGLER_COLOUR, colour, label
from dagtop.ui.renderables.fit import fit_line


def headline(steady: SteadyVerdict | None, analysis: IterationAnalysis, width: int | None = None) -> Text:
    """What held over the recent window first, then the iteration on screen, in at most ``width`` cells::

        io on the critical path 78 % (last 20) · straggler rank 1 (io +122 ms, late 18/20) │ it 55: io 81 % · …

    Before there is a window (fewer than two iterations) the iteration's own verdict leads. The straggler's
    figure is its busy time over the other ranks' median, the ranks table's Δ busy. Where the line does not fit,
    its words shorten before a figure goes, and the iteration's own share stays (80 columns)::

        io 78 % (last 20) · straggler rank 1 (io +122 ms, late 18/20) │ it 55: io 81 %
    """
    incomplete = [Text("incomplete: a rank's events are missing · ", style=STRAGGLER_COLOUR),
                  Text("incomplete · ", style=STRAGGLER_COLOUR)] if not analysis.complete else []
    now_share = f"{analysis.shares.get(analysis.bottleneck, 0.0) * 100:.0f} %"
    if steady is None:
        lead = [_bottleneck(analysis.bottleneck, share, style="bold")
                for share in (f" on the critical path {now_share}", f" {now_share} of critical path",
                              f" {now_share} of path", f" {now_share}")]
        s = analysis.straggler
        tail = [Text(f" · {_communication(analysis)} · ").append_text(
            Text("no straggler") if s is None else _straggler(f"rank {s.rank}", s.category, s.busy_excess_ms, ""))]
        return fit_line([incomplete, lead, tail], (0, 1, 1, 1), width if width is not None else 10**6)
    share, window = f"{steady.share * 100:.0f} %", f" (last {steady.iterations})"
    lead = [_bottleneck(steady.bottleneck, words, style="bold")
            for words in (f" on the critical path {share}{window}", f" {share} of critical path{window}",
                          f" {share} of path{window}", f" {share}{window}", f" {share}")]
    st = steady.straggler
    late = f", late {st.late}/{steady.iterations}" if st is not None else ""
    straggler = [Text(" · no straggler")] if st is None else [
        Text(" · ").append_text(_straggler(f"rank {st.rank}", st.category, st.busy_excess_ms, late)),
        Text(" · ").append_text(_straggler(f"r{st.rank}", st.category, st.busy_excess_ms, late))]
    now = Text.assemble((f" │ it {analysis.iteration}: ", "dim"),
                        (label(analysis.bottleneck), colour(analysis.bottleneck)), (f" {now_share}", "dim"))
    exposed = Text(f" · {_communication(analysis)}", style="dim")
    its_late = Text(f" · rank {analysis.straggler.rank} late" if analysis.straggler else "", style="dim")
    iteration = [Text.assemble(now, exposed, its_late), Text.assemble(now, exposed), now]
    # Give way: the iteration's straggler (the window names it), the lead's words, the exposed figure, the
    # window (the straggler's "late 18/20" says it too), the word "rank".
    order = (0, 3, 1, 1, 3, 1, 1, 2)
    return fit_line([incomplete, lead, straggler, iteration], order, width if width is not None else 10**6)


def _bottleneck(category: str, words: str, style: str) -> Text:
    """``io on the critical path 78 %``: the category in its colour, then ``words``."""
    return Text.assemble((label(category), f"{style} {colour(category)}"), (words, style))


def _communication(analysis: IterationAnalysis) -> str:
    """Exposed communication, or that there was none to see: several ranks and no collective timed (no DDP)."""
    if len(analysis.ranks) > 1 and not analysis.collectives:
        return "no comm seen"
    return f"exposed {analysis.exposed_comm_ms:.0f} ms"


def _straggler(rank: str, category: str, busy_ms: float, tail: str) -> Text:
    """``straggler rank 1 (io +122 ms…)``: the rank in red, the category in its colour."""
    return Text.assemble((f"straggler {rank}", f"bold {STRAGGLER_COLOUR}"), " (",
                         (label(category), colour(category)), f" {busy_ms:+.0f} ms{tail})")


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


