"""The screen for many ranks: the lateness heatmap, the sortable scrolling rank table, and `--refresh`."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from functools import cache

import pytest
from helpers.frames import ListSource
from test_ui_helpers import fake_telemetry
from textual.pilot import Pilot
from textual.widget import Widget

from dagtop.commands.cli import main
from dagtop.model import lateness
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import IterationAnalysis
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.app import DagtopApp, make_app
from dagtop.ui.renderables.heatmap import heatmap_rows
from dagtop.ui.renderables.timeline import timeline_rows
from dagtop.ui.widgets.rank_table import RankTable
from dagtop.ui.widgets.timeline import Timeline

SLOW = 37
"""The slow rank of the 64-rank job: its input takes three times as long."""


def job_frames(ranks: int, slow: tuple[int, ...] = (SLOW,), iterations: int = 12) -> list[RawFrame]:
    return synthetic_frames(SyntheticJob(ranks=ranks, slow_ranks=slow, slow_category="io", slow_factor=3.0),
                            iterations=iterations)


@cache
def analyses(ranks: int, slow: tuple[int, ...] = (SLOW,)) -> tuple[IterationAnalysis, ...]:
    pipeline = Pipeline(expected_ranks=ranks)
    pipeline.feed(job_frames(ranks, slow))
    pipeline.finish()
    return pipeline.snapshot().iterations


def run(test: Callable[[DagtopApp, Pilot[int]], Awaitable[None]], ranks: int = 64,
        size: tuple[int, int] = (120, 36)) -> None:
    app = make_app(ListSource(job_frames(ranks)), sampler=fake_telemetry, source_label="synthetic",
                   frame_interval_s=0.05)

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            for _ in range(1200):
                if app.shown.finished and app.shown.iterations:
                    break
                await pilot.pause(0.05)
            assert app.shown.finished, "the synthetic job was not read in time"
            await pilot.pause()
            await test(app, pilot)

    asyncio.run(go())


def screen_text(app: DagtopApp, widget: type[Widget]) -> str:
    """What ``widget`` shows, border included, a line per row."""
    shown = app.query_one(widget)
    return "\n".join(line.text for line in shown.render_lines(shown.region.reset_offset))


# ---------------------------------------------------------------------------------------------- the model


def test_the_slow_rank_is_late_and_always_the_same() -> None:
    window = lateness.lateness_window(analyses(64))
    assert window.order[0] == SLOW
    assert window.pattern.kind == "same" and window.pattern.ranks[0] == SLOW
    assert window.pattern.describe() == f"always r{SLOW} (late 12/12)"


def test_no_slow_rank_means_no_rank_late() -> None:
    window = lateness.lateness_window(analyses(32, ()))
    assert window.pattern.kind == "none"
    assert "no rank late" in window.pattern.describe()


def test_a_rank_late_once_is_a_one_off_and_rotating_ranks_are_told_apart() -> None:
    good, bad_a, bad_b = analyses(32, ()), analyses(32, (5,)), analyses(32, (9,))
    one_off = lateness.lateness_pattern([*good[:6], bad_a[6], *good[7:]])
    assert (one_off.kind, one_off.ranks, one_off.first_iteration) == ("one-off", (5,), bad_a[6].iteration)
    rotating = lateness.lateness_pattern([bad_a[i] if i % 2 else bad_b[i] for i in range(12)])
    assert rotating.kind == "rotating" and set(rotating.ranks) == {5, 9}


# ---------------------------------------------------------------------------------------------- drawing cost


def test_a_redraw_builds_only_the_rows_drawn_and_computes_lateness_once(monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[int] = []
    real = lateness._compute_lateness

    def counted(a: IterationAnalysis) -> dict[int, float]:
        computed.append(a.iteration)
        return real(a)

    monkeypatch.setattr(lateness, "_compute_lateness", counted)
    cells = {}
    for ranks in (64, 1024):
        window = lateness.lateness_window(analyses(ranks))
        computed.clear()
        lines = heatmap_rows(lateness.lateness_window(analyses(ranks)), 40, 12)
        assert computed == []  # memoised: a redraw of the same window computes nothing
        assert len(lines) == 12 and lines[1].plain.startswith(f"r{SLOW}")
        cells[ranks] = sum(len(line) for line in lines[:-1])
        rows = timeline_rows(window.iterations[-1], 80, 12)
        assert len(rows) == 12 and any(row.label == f"r{SLOW}" for row in rows)
    assert cells[64] == cells[1024]  # the same cells drawn for 64 ranks as for 1024


# ---------------------------------------------------------------------------------------------- the screen


def test_the_heatmap_shows_beside_the_timeline_slow_rank_first() -> None:
    async def check(app: DagtopApp, pilot: Pilot[int]) -> None:
        text = screen_text(app, Timeline)
        assert f"always r{SLOW}" in text
        lines = text.splitlines()
        header = next(i for i, line in enumerate(lines) if " it 0" in line)  # the heatmap's: its first iteration
        first_row = re.search(r" r(\d+) +([·░▒▓█]{12}) *│$", lines[header + 1])  # the heatmap: on the right
        assert first_row is not None, text
        assert first_row[1] == str(SLOW) and "·" not in first_row[2], text  # first, and late in all 12 iterations
        assert "lateness" in str(app.query_one(Timeline).border_subtitle)

    run(check)


def test_few_ranks_draw_no_heatmap() -> None:
    async def check(app: DagtopApp, pilot: Pilot[int]) -> None:
        text = screen_text(app, Timeline)
        assert "always r" not in text and "no rank late" not in text
        assert not app.query_one(Timeline).border_subtitle

    run(check, ranks=8)


def table_ranks(app: DagtopApp) -> list[int]:
    """The rank numbers in the ranks table's rows, top to bottom (the ◀ straggler mark left out)."""
    found = re.findall(r"^[│ ]*(?:◀ )?(\d+) ", screen_text(app, RankTable), flags=re.MULTILINE)
    return [int(r) for r in found]


def test_the_rank_table_sorts_and_scrolls() -> None:
    async def check(app: DagtopApp, pilot: Pilot[int]) -> None:
        table = app.query_one(RankTable)
        page = table.page()
        assert 1 <= page < 64
        slowest = table_ranks(app)
        assert slowest[0] == SLOW and len(slowest) == page  # 64 do not fit: the slowest first
        await pilot.press("s")
        assert table.sort == "Δ busy" and "by Δ busy · 1–" in screen_text(app, RankTable)
        assert table_ranks(app)[0] == SLOW
        await pilot.press("s")
        assert table.sort == "rank"
        assert table_ranks(app) == list(range(page))
        await pilot.press("down", "down")
        assert table_ranks(app) == list(range(2, 2 + page))
        await pilot.press("pagedown")
        assert table_ranks(app) == list(range(2 + page, 2 + 2 * page))
        await pilot.press("end")
        assert table_ranks(app) == list(range(64 - page, 64))
        assert f"{64 - page + 1}–64 of 64" in screen_text(app, RankTable)
        assert table.rows_built == page  # the rows drawn, not the 64
        await pilot.press("home")
        assert table_ranks(app)[0] == 0
        for _ in range(5):  # once round: back to the table as it was
            await pilot.press("s")
        assert table.sort == "auto" and table_ranks(app) == slowest

    run(check)


# ---------------------------------------------------------------------------------------------- --refresh


@pytest.mark.parametrize(("value", "says"), [("0", "must be from 0.05 to 60 seconds"), ("x", "not a number")])
def test_a_bad_refresh_is_refused_in_one_line(value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--refresh", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
