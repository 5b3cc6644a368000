"""The modal screens as a person sees them: the help and the what-if details draw their whole content (readable
at 120x36 and, scrolling, at 80x24), and a rank picked with ``r`` comes first in the timeline and the ranks table."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import pytest
from rich.console import Console
from test_ui_helpers import fake_telemetry, fixture, two_rank_iteration, wait_loaded
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widget import Widget

from dagtop.io.sources import RecordingSource
from dagtop.model.change import Change
from dagtop.ui.app import DagtopApp, make_app
from dagtop.ui.screens.help import KEYS, PANELS, HelpScreen, help_renderable
from dagtop.ui.screens.what_if import WhatIfDetails, WhatIfScreen
from dagtop.ui.widgets.rank_table import RankTable
from dagtop.ui.widgets.timeline import Timeline

SIZES = [(120, 36), (80, 24)]


def replay_app(name: str = "straggler1-io") -> DagtopApp:
    return make_app(RecordingSource(fixture(name), speed=0), sampler=fake_telemetry,
                    source_label=f"replay demo-{name}.dagtop")


def run(size: tuple[int, int], body: Callable[[DagtopApp, Pilot[int]], Awaitable[None]]) -> None:
    app = replay_app()

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_loaded(pilot, app)
            await body(app, pilot)

    asyncio.run(main())


def drawn(app: DagtopApp) -> str:
    """The screen on top as the terminal shows it, line by line (a box drawn empty has none of its text)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def drawn_widget(widget: Widget) -> list[str]:
    """The lines a widget draws in its own region, borders taken away."""
    return [words(strip.text) for strip in widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))]


def words(text: str) -> str:
    """Text with box borders, and the line breaks and indents of wrapping, reduced to single spaces."""
    return " ".join(re.sub(r"[│╭╮╰╯─▁▂▃▄▅▆▇█]", " ", text).split())


async def opened(app: DagtopApp, pilot: Pilot[int], key: str, screen: type) -> None:
    await pilot.press(key)
    for _ in range(200):  # generous: the machine is shared
        if isinstance(app.screen, screen):
            break
        await pilot.pause(0.05)
    assert isinstance(app.screen, screen)
    await pilot.pause()


async def scrolled_to_end(app: DagtopApp, pilot: Pilot[int]) -> None:
    await pilot.press("end")
    await pilot.pause(0.3)


def plain(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


# ---------------------------------------------------------------------------------------------------- help


def test_help_content_names_every_key_and_every_panel() -> None:
    text = words(plain(help_renderable(), 200))
    for key, what in KEYS + PANELS:
        assert words(f"{key} {what}") in text
    assert "critical path ▒ off the path · waiting for other ranks ━ collective on every rank" in text


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_question_mark_draws_the_keys_and_panels_and_fits_the_screen(size: tuple[int, int]) -> None:
    async def body(app: DagtopApp, pilot: Pilot[int]) -> None:
        await opened(app, pilot, "question_mark", HelpScreen)
        box = app.screen.query_one("#help-box")
        assert box.region.width >= min(100, size[0] - 4) and box.region.height >= min(20, size[1] - 2)
        assert app.screen.region.contains_region(box.region)
        top = words(drawn(app))
        assert "dagtop: what holds each iteration of your job back" in top
        assert "p, space pause / resume the screen" in top and "r focus a rank: its rows first" in top
        assert "Panels" in top and "status source, ranks connected" in top
        if size == (120, 36):  # all of it at once, a line per key and per panel
            missing = [name for name, meaning in KEYS + PANELS if words(f"{name} {meaning}") not in top]
            assert not missing, (missing, top)
            assert "Press escape or ? to close." in top
        await scrolled_to_end(app, pilot)
        end = words(drawn(app))
        assert "Colours ■ io ■ pcie ■ compute ■ all-reduce ■ other" in end and "Press escape or ? to close." in end
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)

    run(size, body)


# ---------------------------------------------------------------------------------------------------- what-if


def test_what_if_details_give_each_change_its_prediction_and_its_assumption() -> None:
    a = two_rank_iteration()
    text = words(plain(WhatIfDetails(a), 200))
    for w in a.what_if:
        assert re.search(rf"{re.escape(w.label)}(?: \?)? {w.iteration_ms:.1f} ×{w.throughput:.2f}", text), w.label
        assert f"{w.label} {w.change.assumption}" in text
    assert f"{Change.IDENTITY} {Change.IDENTITY.assumption}" in text
    assert "ms/it the iteration time the model predicts" in text and "throughput samples/s with the change" in text


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_w_draws_each_change_with_its_prediction_and_assumption_and_fits_the_screen(size: tuple[int, int]) -> None:
    async def body(app: DagtopApp, pilot: Pilot[int]) -> None:
        a = app.shown_analysis()
        assert a is not None and a.what_if
        await opened(app, pilot, "w", WhatIfScreen)
        box = app.screen.query_one("#what-if-box")
        assert box.region.width >= min(100, size[0] - 4) and box.region.height >= min(20, size[1] - 2)
        assert app.screen.region.contains_region(box.region)
        top = words(drawn(app))
        assert f"Iteration {a.iteration}: measured {a.measured_ms:.1f} ms" in top
        assert "change ms/it throughput" in top
        for w in a.what_if:  # the table: every change with its predicted time and throughput
            at_most, at_least = ("≤", "≥") if w.lower_bound else ("", "")  # a lower bound's gain, said as one
            assert re.search(rf"{re.escape(w.label)}(?: \?)? {at_most}{w.iteration_ms:.1f} {at_least}×{w.throughput:.2f}",
                             top), str(w)
        assert "ms/it the iteration time the model predicts with the change" in top
        await scrolled_to_end(app, pilot)
        end = words(drawn(app))
        assert "Press escape or w to close." in end
        assert "Every other task keeps its measured duration" in end  # the closing words before the key hint
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, WhatIfScreen)

    run(size, body)


# ---------------------------------------------------------------------------------------------------- rank picker


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_rank_picked_with_r_comes_first_in_the_timeline_and_the_ranks_table(size: tuple[int, int]) -> None:
    async def body(app: DagtopApp, pilot: Pilot[int]) -> None:
        def order() -> tuple[list[str], list[int]]:
            lanes = [line.split()[0] for line in drawn_widget(app.query_one(Timeline)) if re.match(r"r\d+ ", line)]
            ranks = [int(m.group(1)) for line in drawn_widget(app.query_one(RankTable))
                     if (m := re.match(r"(?:◀ )?(\d+) ", line))]
            return lanes, ranks

        lanes, ranks = order()
        assert lanes[0] == "r0" and ranks == [0, 1]
        await pilot.press("r", "down", "down", "enter")  # options: all ranks, rank 0, rank 1
        for _ in range(100):
            if app.focus_rank == 1:
                break
            await pilot.pause(0.05)
        await pilot.pause()
        lanes, ranks = order()
        assert lanes[0] == "r1" and lanes.index("r0") > max(i for i, r in enumerate(lanes) if r == "r1")
        assert ranks == [1, 0]
        await pilot.press("r", "up", "up", "enter")  # no focus: by rank again
        await pilot.pause(0.2)
        lanes, ranks = order()
        assert app.focus_rank is None and lanes[0] == "r0" and ranks == [0, 1]

    run(size, body)
