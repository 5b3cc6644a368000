"""Drawing details a person sees in the first minutes: whole axis labels, red only for the straggler, a history as
wide as its panel, no stale rate once the job ended, and a waiting line that fits the command. No App needed,
except where the app builds the line."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading

import pytest
from rich.console import Console
from test_ui_helpers import (
    MS,
    fake_telemetry,
    seg,
    snapshot_of,
    task,
    two_rank_iteration,
)

from dagtop.io.sources import FrameSource
from dagtop.model.frames import RawFrame
from dagtop.model.snapshot import IterationAnalysis, RankInfo
from dagtop.ui.app import make_app
from dagtop.ui.palette import STRAGGLER_COLOUR
from dagtop.ui.renderables.history import AXIS_WIDTH, bar_widths, history_lines
from dagtop.ui.renderables.rank_table import rank_table, visible_rows
from dagtop.ui.renderables.status import status_text
from dagtop.ui.renderables.timeline import LABEL_WIDTH, timeline_rows


def one_task_iteration(total_ms: float) -> IterationAnalysis:
    """One rank computing for ``total_ms``: the timeline's axis spans exactly that."""
    return dataclasses.replace(two_rank_iteration(), tasks=(task(0, "main", "compute", "forward", "net", 0, total_ms),),
                               collectives=(), critical_path=(seg(0, "compute", "net", 0, total_ms),),
                               measured_ms=total_ms, predicted_ms=total_ms)


# ---------------------------------------------------------------------------------------------------- timeline axis


@pytest.mark.parametrize("total_ms", [0.3, 40.0, 163.8, 168.3, 425.0, 5000.0])
@pytest.mark.parametrize("plot_w", [106, 60, 30])
def test_timeline_axis_labels_are_whole_evenly_spaced_ticks_then_the_unit(total_ms: float, plot_w: int) -> None:
    axis = timeline_rows(one_task_iteration(total_ms), LABEL_WIDTH + plot_w, 10)[0].cells.plain
    assert len(axis) == plot_w and axis.endswith(" ms")
    ticks = re.findall(r"┊(\S*)", axis[: -len(" ms")])
    assert ticks, axis
    values = [float(t) for t in ticks]  # "┊" alone, or a label cut short, fails here or below
    step = values[0]
    assert all(abs(v - step * (i + 1)) < 1e-6 * max(step, 1) for i, v in enumerate(values)), axis
    assert values[-1] <= total_ms and step * (len(values) + 1) > total_ms * 0.5, axis
    for t in ticks:  # each tick sits where its time falls
        at = axis.index(f"┊{t} ") if f"┊{t} " in axis else axis.index(f"┊{t}")
        assert abs(at - float(t) / total_ms * plot_w) <= 1, axis


# ---------------------------------------------------------------------------------------------------- colours


def _rank_cells(analysis: IterationAnalysis, focus_rank: int | None = None) -> dict[int, list[str | None]]:
    """Rank number → the colour of each character of its number, as the ranks table draws it."""
    table = rank_table(analysis, height=10, width=80, focus_rank=focus_rank)
    console = Console()
    colours: dict[int, list[str | None]] = {}
    for cell in table.columns[0].cells:
        text = cell.plain  # type: ignore[union-attr]
        digits = re.search(r"\d+", text)
        assert digits is not None
        styles = [cell.get_style_at_offset(console, i) for i in range(digits.start(), digits.end())]  # type: ignore[union-attr]
        colours[int(digits.group())] = [s.color.name if s.color else None for s in styles]
    return colours


def test_only_the_straggler_rank_is_drawn_red() -> None:
    a = two_rank_iteration()  # rank 1 is the straggler
    colours = _rank_cells(a)
    assert colours[1] == [STRAGGLER_COLOUR] and colours[0] == [None]
    calm = dataclasses.replace(a, straggler=None,
                               per_rank=tuple(dataclasses.replace(r, straggler=False) for r in a.per_rank))
    assert _rank_cells(calm) == {0: [None], 1: [None]}


# ---------------------------------------------------------------------------------------------------- focus


def test_the_focused_rank_comes_first_in_the_timeline_and_the_ranks_table() -> None:
    a = two_rank_iteration()
    labels = [r.label for r in timeline_rows(a, LABEL_WIDTH + 75, 20, focus_rank=1)]
    assert labels == ["", "r1 main", "r1 comm", "r0 main", "r0 comm", "⇄ all", "critical"]
    assert [r.label for r in timeline_rows(a, LABEL_WIDTH + 75, 20)][1] == "r0 main"
    shown, slowest_first = visible_rows(a.per_rank, 10, focus_rank=1)
    assert not slowest_first and [r.rank for r in shown] == [1, 0]
    assert [r.rank for r in visible_rows(a.per_rank, 10)[0]] == [0, 1]
    assert list(_rank_cells(a, focus_rank=1)) == [1, 0]


# ---------------------------------------------------------------------------------------------------- history


@pytest.mark.parametrize("count", [1, 2, 7, 30, 71, 200])
def test_history_bars_fill_the_whole_plot_width(count: int) -> None:
    base = two_rank_iteration()
    analyses = [dataclasses.replace(base, iteration=i + 1) for i in range(count)]
    plot_w = 71
    lines = history_lines(analyses, AXIS_WIDTH + plot_w, 9)
    bottom = lines[-2].plain[AXIS_WIDTH:]  # the bars' lowest row: every bar fills it
    assert bottom == "█" * plot_w
    assert lines[-1].plain.rstrip().endswith(str(count))  # the newest at the right edge
    widths = bar_widths(min(count, plot_w), plot_w)
    assert sum(widths) == plot_w and max(widths) - min(widths) <= 1 and min(widths) >= 1


# ---------------------------------------------------------------------------------------------------- status


def _rank(rank: int, connected: bool) -> RankInfo:
    return RankInfo(rank, "node0", 100 + rank, "cpu", "cnn", 1000, 7, 0, 0, connected)


def test_status_line_has_no_stale_rate_once_the_job_ended() -> None:
    snap = snapshot_of(two_rank_iteration(6), two_rank_iteration(7))  # 13.3 it/s
    running = dataclasses.replace(snap, ranks=(_rank(0, True), _rank(1, False)))
    line = status_text(running, source="live tcp://x:1", live=True, lag_s=0.1, paused=False, shown_iteration=7).plain
    assert "13.3 it/s" in line and "ended" not in line
    said_bye = dataclasses.replace(snap, ranks=(_rank(0, False), _rank(1, False)))
    line = status_text(said_bye, source="live tcp://x:1", live=True, lag_s=3.0, paused=False, shown_iteration=7).plain
    assert "13.3" not in line and "— it/s · job ended" in line
    line = status_text(running, source="demo", live=True, lag_s=0.1, paused=False, shown_iteration=7,
                       job_exited=True).plain
    assert "13.3" not in line and "job ended" in line
    replayed = dataclasses.replace(snap, finished=True)
    line = status_text(replayed, source="replay f", live=False, lag_s=None, paused=False, shown_iteration=7).plain
    assert "13.3" not in line and "— it/s · replay ended" in line


# ---------------------------------------------------------------------------------------------------- waiting


class _QuietLiveSource(FrameSource):
    """A live source no rank ever publishes to."""

    live = True
    endpoint = "tcp://127.0.0.1:5555"

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        threading.Event().wait(min(timeout_s, 0.01))  # as a socket would: no busy loop
        return []

    @property
    def finished(self) -> bool:
        return False


class _StartingJob:
    """A demo job whose ranks are still importing torch."""

    running = True

    @property
    def returncodes(self) -> list[int | None]:
        return [None, None]


def _waiting_line(job: object) -> str:
    app = make_app(_QuietLiveSource(), expected_ranks=2, job=job, sampler=fake_telemetry, clock=lambda: 5 * MS)  # type: ignore[arg-type]

    async def main() -> str:
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.2)
            verdict = app.query_one("#verdict")
            return "\n".join(s.text for s in verdict.render_lines(verdict.region.reset_offset))

    return asyncio.run(main())


def test_demo_waiting_line_says_its_ranks_are_starting_not_to_set_dagtop_endpoint() -> None:
    demo = _waiting_line(_StartingJob())
    assert "starting the 2 demo ranks" in demo and "DAGTOP_ENDPOINT" not in demo
    plain = _waiting_line(None)
    assert "DAGTOP_ENDPOINT=tcp://127.0.0.1:5555" in plain and "demo" not in plain
