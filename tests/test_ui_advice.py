"""The advice screen as a person sees it: ``a`` draws the best change first, every advised change with its predicted
step and gain, fix against buy per epoch and the waste, readable at 120x36 and (scrolling) at 80x24."""

from __future__ import annotations

import asyncio

import pytest
from test_ui_helpers import fake_telemetry, fixture, wait_loaded
from test_ui_modals import SIZES, drawn, opened, plain, words
from textual.pilot import Pilot
from textual.widget import Widget

from dagtop.io.sources import RecordingSource
from dagtop.model.advice import Advice, Kind
from dagtop.model.advice_text import advice_of
from dagtop.model.cost import CostTerms, FixOrBuy, Waste
from dagtop.ui.app import DagtopApp, make_app
from dagtop.ui.renderables.advice import AdviceDetails
from dagtop.ui.screens.advice import AdviceScreen

TERMS = CostTerms(gpu_hour_price=2.5, epoch_samples=1_280_000)


def boxed(app: DagtopApp, box: Widget) -> str:
    """The words the advice box shows on screen, the main screen beside it left out."""
    r = box.region
    return words("\n".join(line[r.x:r.right] for line in drawn(app).splitlines()[r.y:r.bottom]))


def run(size: tuple[int, int], body: object) -> None:
    app = make_app(RecordingSource(fixture("advice"), speed=0), sampler=fake_telemetry,
                   source_label="replay demo-advice.dagtop", cost_terms=TERMS)

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_loaded(pilot, app)
            await body(app, pilot)  # type: ignore[operator]

    asyncio.run(main())


async def read_through(app: DagtopApp, pilot: Pilot[int], box: Widget) -> str:
    """Everything the box shows from its top to its end, a page at a time."""
    pages = [boxed(app, box)]
    for _ in range(30):
        await pilot.press("pagedown")
        await pilot.pause(0.2)
        page = boxed(app, box)
        if page == pages[-1]:
            break
        pages.append(page)
    return " ".join(pages)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_draws_the_best_change_first_then_every_advised_change_and_the_cost(size: tuple[int, int]) -> None:
    async def body(app: DagtopApp, pilot: Pilot[int]) -> None:
        advice, _ = advice_of(app.shown, app.shown.iterations, TERMS)
        assert not advice.held and advice.best is not None
        # The demo's io job waits on a loader without workers: more workers is the change to make.
        assert advice.best.kind is Kind.LOADER and advice.best.setting["num_workers"] >= 1
        await opened(app, pilot, "a", AdviceScreen)
        box = app.screen.query_one("#advice-box")
        assert box.region.width >= min(100, size[0] - 4) and app.screen.region.contains_region(box.region)
        top = boxed(app, box)
        assert top.index("best change: num_workers=") < top.index("change ms/step")
        assert words(advice.headline()) in top
        seen = await read_through(app, pilot, box)  # the rest by scrolling, page by page
        for c in (*advice.fixes, *advice.buys):
            assert c.step_ms is not None
            assert f"{c.step_ms:.1f}" in seen and c.gain in seen, c.title
        assert "fix vs buy, per epoch: 10000 steps" in seen and "$2.5/GPU-h" in seen
        assert "waste so far" in seen and "Press escape or a to close." in seen
        await pilot.press("a")
        await pilot.pause()
        assert not isinstance(app.screen, AdviceScreen)

    run(size, body)


def test_a_held_advice_says_why_and_nothing_else() -> None:
    held = Advice(7, 20, 100.0, 0.0, "7 of the 20 steady iterations the verdict needs")
    text = words(plain(AdviceDetails(held, FixOrBuy(CostTerms(), None, "", None, (), Waste(7, 0.1, 0.02, 0, 0))), 120))
    assert text.startswith("no advice yet: 7 of the 20 steady iterations the verdict needs")
    assert "change ms/step" not in text and "waste so far (7 iterations" in text
