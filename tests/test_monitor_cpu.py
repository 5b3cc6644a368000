"""What keeps the monitor's own CPU down: redrawn at most once a frame, only the panels whose iteration changed, at a
lower priority than training (``--nice``, ``DAGTOP_NICE``); and the benchmark that measures it sends real frames."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_ui_app import FakeLiveSource
from test_ui_helpers import fake_telemetry

from dagtop.demo.launch import free_endpoint
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.app import DagtopApp, make_app
from dagtop.ui.widgets.history import History
from dagtop.ui.widgets.status_bar import StatusBar
from dagtop.ui.widgets.timeline import Timeline
from instrument import wire

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_monitor
from helpers.waits import WAIT_S


def _frames(iterations: int) -> list[RawFrame]:
    return synthetic_frames(SyntheticJob(ranks=2), iterations=iterations)


async def _until(pilot, condition, timeout_s: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.02)
    assert condition()


def _run(app: DagtopApp, body) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await body(pilot)

    asyncio.run(main())


def test_news_is_drawn_at_most_once_a_frame_however_often_it_comes() -> None:
    source = FakeLiveSource()
    # A frame of a minute: the app's own timer cannot take the news while the test ticks by hand.
    app = make_app(source, sampler=fake_telemetry, clock=lambda: 0, frame_interval_s=60.0)
    frames = _frames(12)

    async def body(pilot) -> None:  # type: ignore[no-untyped-def]
        source.push(frames[:6])  # the hellos and two iterations
        await _until(pilot, lambda: (s := app.collector.latest.snapshot.latest) is not None and s.iteration >= 1)
        # The first news is drawn at once, unless the app's own timer drew an earlier one (the hellos) in this
        # frame before the iteration came: a loaded machine starts the app slowly. Then it waits for the frame.
        for _ in range(app.ticks_per_frame + 1):
            app.tick()
            if app.shown.latest is not None:
                break
        first = app.shown
        assert first.latest is not None
        source.push(frames[6:])
        await _until(pilot, lambda: (s := app.collector.latest.snapshot.latest) is not None and s.iteration >= 9)
        app.tick()
        assert app.shown is first  # news within the frame waits for the next one
        for _ in range(app.ticks_per_frame):
            app.tick()
        assert app.shown is app.collector.latest.snapshot and app.shown.latest.iteration >= 9  # type: ignore[union-attr]

    _run(app, body)


def test_a_snapshot_without_a_new_iteration_redraws_the_status_line_but_no_chart() -> None:
    source = FakeLiveSource()
    app = make_app(source, sampler=fake_telemetry, clock=lambda: 0, frame_interval_s=0.02)
    frames = _frames(6)  # 2 hellos, then 2 frames per iteration

    async def body(pilot) -> None:  # type: ignore[no-untyped-def]
        source.push(frames[:10])
        await _until(pilot, lambda: app.shown.latest is not None and app.shown.latest.iteration == 3)
        timeline, history, status = app.query_one(Timeline), app.query_one(History), app.query_one(StatusBar)
        charts, line, shown = timeline.view, history.view, app.shown
        source.push([RawFrame(frames[9].received_ns + 1, b"junk")])  # news (one more rejected), no iteration
        await _until(pilot, lambda: app.shown is not shown)
        assert app.shown.rejected == 1 and status.view.snapshot is app.shown  # the status line says so
        assert timeline.view is charts and history.view is line  # the charts were not handed it: nothing to redraw
        source.push(frames[10:])  # iterations 4 and 5
        await _until(pilot, lambda: timeline.view is not charts)
        assert history.view is not line

    _run(app, body)


def _niceness_after(code: str, env: dict[str, str]) -> tuple[str, int]:
    """Run ``code`` (which prints a line) in a fresh Python; its output and the niceness it ended at."""
    out = subprocess.run([sys.executable, "-c", f"{code}; import os; print(os.nice(0))"], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=WAIT_S, check=True).stdout.splitlines()
    return out[0], int(out[-1])


@pytest.mark.parametrize(("requested", "env", "lowered_by"), [
    ("None", {"DAGTOP_NICE": ""}, 10),
    ("None", {"DAGTOP_NICE": "0"}, 0),
    ("None", {"DAGTOP_NICE": "4"}, 4),
    ("3", {"DAGTOP_NICE": "4"}, 3),  # --nice wins over the environment
])
def test_the_monitor_lowers_its_priority_by_default_and_is_told_otherwise(requested: str, env: dict[str, str],
                                                                          lowered_by: int) -> None:
    said, niceness = _niceness_after(f"from dagtop.commands.cli import lower_priority; print(lower_priority({requested}))", env)
    assert said == "None"
    assert niceness == min(19, os.nice(0) + lowered_by)


def test_a_bad_dagtop_nice_is_one_line_and_leaves_the_priority() -> None:
    said, niceness = _niceness_after("from dagtop.commands.cli import lower_priority; print(lower_priority(None))",
                                     {"DAGTOP_NICE": "lots"})
    assert said == "DAGTOP_NICE=lots: not a whole number: 'lots'"
    assert niceness == os.nice(0)
    run = subprocess.run([sys.executable, "-m", "dagtop", "record", "-o", os.devnull, "--timeout", "1"],
                         capture_output=True, text=True, env={**os.environ, "DAGTOP_NICE": "lots"}, timeout=WAIT_S)
    assert run.returncode == 2
    assert run.stderr == "dagtop: DAGTOP_NICE=lots: not a whole number: 'lots'\n"


@pytest.mark.parametrize(("argv", "lowered_by"), [([], 10), (["--nice", "2"], 2)])
def test_dagtop_record_runs_niced(tmp_path: Path, argv: list[str], lowered_by: int) -> None:
    endpoint = free_endpoint()
    recorder = subprocess.Popen([sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o",
                                 str(tmp_path / "run.dagtop"), "--timeout", str(WAIT_S), *argv],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={k: v for k, v in os.environ.items() if k != "DAGTOP_NICE"})
    try:
        expected = min(19, os.nice(0) + lowered_by)
        process = psutil.Process(recorder.pid)
        deadline = time.monotonic() + WAIT_S
        while process.nice() != expected and time.monotonic() < deadline and recorder.poll() is None:
            time.sleep(0.1)
        assert process.nice() == expected
    finally:
        recorder.terminate()
        recorder.wait(WAIT_S)


def test_the_benchmark_sends_what_a_rank_sends_and_the_model_takes_all_of_it() -> None:
    job = SyntheticJob(ranks=4, blocks=12)
    iterations = 6
    by_rank: dict[int, list[bytes]] = {r: [] for r in range(job.ranks)}
    for frame in synthetic_frames(job, iterations=iterations, hello=False, start_ns=bench_monitor.START_NS):
        by_rank[wire.decode(frame.payload).rank].append(frame.payload)
    merged = sorted(((when, payload) for r in range(job.ranks)  # stable: each rank's frames stay in send order
                     for when, payload, _ in bench_monitor.rank_stream(job, r, by_rank[r], rate=5.0, seconds=4.0)),
                    key=lambda sent: sent[0])
    kinds = {type(wire.decode(p)).__name__ for _, p in merged}
    assert kinds == {"Hello", "Buckets", "IterationBatch", "Telemetry", "Heartbeat"}
    pipeline = Pipeline()
    pipeline.feed(RawFrame(int(when * 1e9), payload) for when, payload in merged)
    pipeline.finish()
    snapshot = pipeline.snapshot()
    assert (snapshot.rejected, snapshot.dropped, pipeline.duplicates, snapshot.incomplete) == (0, 0, 0, 0)
    assert [a.iteration for a in snapshot.iterations] == list(range(iterations))
    assert {t.rank for t in snapshot.telemetry} == set(range(job.ranks))
    assert {r.host for r in snapshot.ranks} == {"node0"} and snapshot.ranks_expected == job.ranks
