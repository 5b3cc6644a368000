"""Pilot tests: every key, pausing while collecting goes on, lag, a dead demo job, and the collector's coalescing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import ClassVar

from test_ui_helpers import fake_telemetry, fixture, wait_loaded

from dagtop.io.sources import FrameSource, RecordingSource
from dagtop.model.frames import RawFrame
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.app import DagtopApp, make_app
from dagtop.ui.collector import Collector
from dagtop.ui.screens.help import HelpScreen
from dagtop.ui.screens.rank_picker import RankPicker
from dagtop.ui.screens.what_if import WhatIfScreen
from dagtop.ui.widgets.alert import Alert
from dagtop.ui.widgets.rank_table import RankTable
from dagtop.ui.widgets.status_bar import StatusBar
from dagtop.ui.widgets.timeline import Timeline

SIZE = (120, 36)


class FakeLiveSource(FrameSource):
    """A live source the test feeds by hand."""

    live = True
    endpoint = "tcp://127.0.0.1:0"

    def __init__(self) -> None:
        self._frames: list[RawFrame] = []
        self._lock = threading.Lock()

    def push(self, frames: list[RawFrame]) -> None:
        with self._lock:
            self._frames.extend(frames)

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        with self._lock:
            out, self._frames = self._frames[:max_frames], self._frames[max_frames:]
        if not out:
            threading.Event().wait(min(timeout_s, 0.01))
        return out

    @property
    def finished(self) -> bool:
        return False


def replay_app() -> DagtopApp:
    return make_app(RecordingSource(fixture("straggler1-io"), speed=0), sampler=fake_telemetry,
                    source_label="replay demo-straggler1-io.dagtop")


def run(test: Callable[[DagtopApp, object], Awaitable[None]], app: DagtopApp | None = None) -> None:
    app = app or replay_app()

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_loaded(pilot, app) if not app.live else None
            await test(app, pilot)

    asyncio.run(main())


def test_q_quits() -> None:
    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running

    run(body)


def test_p_and_space_pause_and_resume() -> None:
    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        assert not app.paused
        await pilot.press("p")
        assert app.paused and "PAUSED" in str(app.query_one(StatusBar).render())
        await pilot.press("space")
        assert not app.paused
        await pilot.press("space")
        assert app.paused

    run(body)


def test_left_and_right_browse_iterations_left_pauses() -> None:
    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        latest = app.shown.iterations[-1].iteration
        await pilot.press("right")  # live: nothing newer than the newest
        assert not app.paused and app.selected is None
        await pilot.press("left")
        assert app.paused and app.selected == latest - 1
        await pilot.press("left", "left")
        assert app.selected == latest - 3
        await pilot.press("right")
        await pilot.pause()
        assert app.selected == latest - 2
        timeline = app.query_one(Timeline)
        assert timeline.view.analysis is not None and timeline.view.analysis.iteration == latest - 2
        status = str(app.query_one(StatusBar).render())  # the words shorten where the line is full: "it 27/29"
        assert f"iteration {latest - 2} of {latest}" in status or f"it {latest - 2}/{latest}" in status, status
        assert f"iteration {latest - 2}" in str(timeline.border_title)
        await pilot.press("p")  # resume: back to the newest
        assert app.selected is None and app.query_one(Timeline).view.analysis.iteration == latest  # type: ignore[union-attr]

    run(body)


def test_r_focuses_a_rank_escape_keeps_it_and_no_focus_clears_it() -> None:
    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("r")
        assert isinstance(app.screen, RankPicker)
        await pilot.press("down", "down", "enter")  # options: all ranks, rank 0, rank 1
        await pilot.pause()
        assert app.focus_rank == 1 and not isinstance(app.screen, RankPicker)
        assert app.query_one(RankTable).view.focus_rank == 1 and app.query_one(Timeline).view.focus_rank == 1
        await pilot.press("r", "escape")
        await pilot.pause()
        assert app.focus_rank == 1
        await pilot.press("r", "up", "up", "enter")
        await pilot.pause()
        assert app.focus_rank is None

    run(body)


def test_w_opens_and_closes_the_what_if_details() -> None:
    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("w")
        assert isinstance(app.screen, WhatIfScreen)
        assert app.screen.analysis is app.shown.latest
        await pilot.press("w")
        assert not isinstance(app.screen, WhatIfScreen)

    run(body)


def test_question_mark_opens_help_and_escape_closes_it() -> None:
    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running  # q in a modal closes the modal, not the app
        await pilot.press("question_mark", "q")
        assert not isinstance(app.screen, HelpScreen) and app.is_running

    run(body)


def _frames(iterations: int) -> list[RawFrame]:
    return synthetic_frames(SyntheticJob(ranks=2), iterations=iterations)


def _live_app(source: FakeLiveSource, now_ns: list[int], job: object = None) -> DagtopApp:
    return make_app(source, sampler=fake_telemetry, clock=lambda: now_ns[0], job=job,  # type: ignore[arg-type]
                    frame_interval_s=0.02)


async def _until(pilot, condition: Callable[[], bool], timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    assert condition()


def test_pause_freezes_the_screen_while_collecting_goes_on_and_lag_is_monitor_now_minus_arrival() -> None:
    source = FakeLiveSource()
    now = [0]
    app = _live_app(source, now)

    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        everything = _frames(8)  # 2 hellos, then 2 frames per iteration
        frames, later = everything[:10], everything[10:]
        source.push(frames)
        await _until(pilot, lambda: app.shown.latest is not None and app.shown.latest.iteration >= 2)
        newest = max(f.received_ns for f in frames)
        now[0] = newest + 500_000_000
        await _until(pilot, lambda: app.query_one(StatusBar).lag_s is not None)
        await _until(pilot, lambda: abs((app.query_one(StatusBar).lag_s or 0) - 0.5) < 1e-6)
        shown = app.shown.latest.iteration  # type: ignore[union-attr]
        await pilot.press("p")
        source.push(later)
        await _until(pilot, lambda: (s := app.collector.latest.snapshot.latest) is not None and s.iteration >= 6)
        await pilot.pause(0.1)
        assert app.shown.latest.iteration == shown  # type: ignore[union-attr]
        assert app.query_one(Timeline).view.analysis.iteration == shown  # type: ignore[union-attr]
        await pilot.press("p")
        assert app.query_one(Timeline).view.analysis.iteration >= 6  # type: ignore[union-attr]

    run(body, app)


class DeadJob:
    running = False
    returncodes: ClassVar[list[int]] = [1, 0]


def test_a_dead_demo_job_is_said_on_screen() -> None:
    app = _live_app(FakeLiveSource(), [0], job=DeadJob())

    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await _until(pilot, lambda: app.job_exited is not None)
        alert = app.query_one(Alert)
        assert alert.display and "died (exit codes [1, 0])" in str(alert.render())

    run(body, app)


def test_waiting_screen_tells_where_ranks_must_publish() -> None:
    app = _live_app(FakeLiveSource(), [0])

    async def body(app: DagtopApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.pause(0.1)
        assert "DAGTOP_ENDPOINT=tcp://127.0.0.1:0" in app.query_one("#verdict").view.waiting_hint  # type: ignore[attr-defined]
        await pilot.press("r")  # nothing to focus yet: no crash, no picker
        assert not isinstance(app.screen, RankPicker)

    run(body, app)


def test_collector_coalesces_a_burst_into_one_latest_snapshot() -> None:
    source = FakeLiveSource()
    collector = Collector(source, clock=lambda: 10**12, publish_every_s=0.0)
    source.push(_frames(20))
    before = collector.latest.version
    collector.step()
    assert collector.latest.version == before + 1  # one update for the whole burst, not one per frame
    latest = collector.latest.snapshot.latest
    assert latest is not None and latest.iteration >= 18
    collector.step()  # nothing new: no new update
    assert collector.latest.version == before + 1


def test_a_telemetry_sample_alone_does_not_make_a_new_snapshot() -> None:
    source = FakeLiveSource()
    samples = iter(range(1000))
    collector = Collector(source, sampler=lambda: next(samples), telemetry_every_s=0.0)  # type: ignore[arg-type,return-value]
    source.push(_frames(3))
    collector.step()
    snapshot = collector.latest.snapshot
    collector.step()  # a new telemetry sample, no frames
    assert collector.latest.telemetry != 0 and collector.latest.snapshot is snapshot  # the screen need not redraw
