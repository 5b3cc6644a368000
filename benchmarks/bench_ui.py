"""UI benchmark: the UI thread's work per frame with 64 ranks, and lag while 64 ranks publish over ZeroMQ.

    python benchmarks/bench_ui.py [--ranks 64] [--rate 2] [--seconds 15]

1. Frame cost: a 64-rank synthetic snapshot (window full) handed to a headless app at 120x36; one frame is
   the tick that takes the new snapshot plus Textual laying out and rendering every panel (target ≤ 50 ms).
   The renderables alone are timed too.
2. Lag: a publisher process sends every rank's frames for one iteration at ``--rate`` iterations/s to a live
   app (ZmqSource → collector thread → Pipeline → UI); each time the UI draws a new snapshot we record
   monitor now − arrival of the newest frame in it (target < 1 s), and how many iterations it shows behind.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time

from rich.console import Console
from textual.geometry import Region

from dagtop.demo.launch import free_endpoint
from dagtop.io.sources import ZmqSource
from dagtop.io.telemetry import TelemetrySample
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import Snapshot
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.app import DagtopApp, make_app
from dagtop.ui.collector import Update
from dagtop.ui.renderables.history import HistoryChart
from dagtop.ui.renderables.rank_table import rank_table
from dagtop.ui.renderables.timeline import TimelineChart
from dagtop.ui.renderables.verdict import critical_path_bar, headline
from dagtop.ui.renderables.what_if import what_if_table
from dagtop.ui.widgets.panel import Panel
from dagtop.ui.widgets.telemetry import Telemetry


def no_telemetry() -> TelemetrySample:
    return TelemetrySample(None, (), "benchmark: telemetry off")


def job(ranks: int) -> SyntheticJob:
    return SyntheticJob(ranks=ranks, slow_ranks=(ranks // 2,), slow_factor=3.0)


def snapshots(ranks: int, iterations: int) -> tuple[Snapshot, Snapshot]:
    """Two consecutive snapshots of a full window (so the second is news to the app)."""
    pipeline = Pipeline(window=iterations)
    frames = synthetic_frames(job(ranks), iterations=iterations + 1)
    pipeline.feed(frames[:-ranks])
    first = pipeline.snapshot()
    pipeline.feed(frames[-ranks:])
    return first, pipeline.snapshot()


def ms(values: list[float]) -> str:
    values = sorted(values)
    return (f"median {statistics.median(values) * 1e3:6.1f} ms  p95 {values[int(0.95 * (len(values) - 1))] * 1e3:6.1f}"
            f" ms  max {values[-1] * 1e3:6.1f} ms")


def bench_renderables(snap: Snapshot, repeat: int) -> None:
    a = snap.latest
    assert a is not None
    console = Console(width=118, file=open("/dev/null", "w"), color_system="truecolor")  # noqa: SIM115
    parts = {
        "verdict+bar": lambda: (headline(a.steady, a, 118), critical_path_bar(a, 118)),
        "timeline": lambda: TimelineChart(a, 9, focus_rank=3),
        "history": lambda: HistoryChart(snap.iterations, 8, a.iteration),
        "rank table": lambda: rank_table(a, 9, 56, 3),
        "what-if": lambda: what_if_table(a, 56),
    }
    total = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for make in parts.values():
            renderable = make()
            for r in renderable if isinstance(renderable, tuple) else (renderable,):
                list(console.render(r, console.options))
        total.append(time.perf_counter() - t0)
    print(f"  renderables alone (all panels): {ms(total)}")


async def bench_frame(first: Snapshot, second: Snapshot, repeat: int) -> None:
    source = ZmqSource(free_endpoint())
    app = make_app(source, sampler=no_telemetry)
    times, via_pilot = [], []
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.2)
        widgets = [w for w in app.screen.walk_children() if isinstance(w, (Panel, Telemetry))]
        for i in range(repeat):
            app.collector.latest = Update(app.collector.latest.version + 1, first if i % 2 else second, None)
            t0 = time.perf_counter()
            app.tick()  # hands the new view to every panel
            for w in widgets:  # what Textual's compositor asks of each panel on the next refresh
                w.render_lines(Region(0, 0, w.size.width, w.size.height))
            times.append(time.perf_counter() - t0)
            await pilot.pause()
        for i in range(repeat):
            app.collector.latest = Update(app.collector.latest.version + 1, first if i % 2 else second, None)
            t0 = time.perf_counter()
            app.tick()
            await pilot.pause()
            via_pilot.append(time.perf_counter() - t0)
    source.close()
    print(f"  one frame on the UI thread (tick + every panel rendered, 120x36): {ms(times)}")
    print(f"  tick + Textual's whole refresh cycle via pilot.pause (includes idle waits): {ms(via_pilot)}")


def publish(endpoint: str, ranks: int, rate: float, seconds: float, ready: mp.Event) -> None:  # type: ignore[type-arg]
    import zmq

    iterations = int(seconds * rate) + 1
    frames = synthetic_frames(job(ranks), iterations=iterations)
    hellos, rest = frames[:ranks], frames[ranks:]
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.SNDHWM, 1_000_000)
    sock.connect(endpoint)
    ready.wait(10)
    time.sleep(0.5)  # slow joiner
    for f in hellos:
        sock.send(f.payload)
    start = time.monotonic()
    for k in range(iterations):
        delay = start + k / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for f in rest[k * ranks:(k + 1) * ranks]:
            sock.send(f.payload)
    time.sleep(0.5)
    sock.close()


async def bench_lag(ranks: int, rate: float, seconds: float, verbose: bool = False) -> None:
    endpoint = free_endpoint()
    source = ZmqSource(endpoint)
    app: DagtopApp = make_app(source, sampler=no_telemetry, expected_ranks=ranks)
    lags: list[float] = []
    shown: list[int] = []
    push = app._push_view

    def measured_push() -> None:
        push()
        if app.shown.received_ns:
            lags.append((time.perf_counter_ns() - app.shown.received_ns) / 1e9)
            if app.shown.latest is not None:
                shown.append(app.shown.latest.iteration)

    app._push_view = measured_push  # type: ignore[method-assign]
    ready = mp.Event()
    publisher = mp.Process(target=publish, args=(endpoint, ranks, rate, seconds, ready), daemon=True)
    publisher.start()
    async with app.run_test(size=(120, 36)) as pilot:
        ready.set()
        deadline = time.monotonic() + seconds + 10
        while publisher.is_alive() and time.monotonic() < deadline:
            await pilot.pause(0.1)
        await pilot.pause(1.0)
    publisher.join(5)
    source.close()
    sent = int(seconds * rate) + 1
    last = shown[-1] if shown else None
    print(f"  {ranks} ranks at {rate:g} it/s for {seconds:g} s: {len(lags)} frames drawn, "
          f"last iteration shown {last} of {sent - 1}")
    if lags:
        print(f"  lag at draw (monitor now − arrival of newest frame drawn): {ms(lags)}")
        steady = lags[len(lags) // 5:]
        print(f"  the same after the first fifth (start-up excluded):        {ms(steady)}")
        if verbose:
            print("  lags in order (ms):", " ".join(f"{x * 1e3:.0f}" for x in lags))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--window", type=int, default=120, help="iterations in the snapshot (the app's default)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rate", type=float, default=2.0, help="iterations/s published in the lag test")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--verbose", action="store_true", help="print every lag measured")
    args = parser.parse_args()
    print(f"building a {args.ranks}-rank snapshot of {args.window} iterations…")
    first, second = snapshots(args.ranks, args.window)
    print("frame cost (target ≤ 50 ms):")
    bench_renderables(second, args.repeat)
    asyncio.run(bench_frame(first, second, args.repeat))
    print("lag (target < 1 s):")
    asyncio.run(bench_lag(args.ranks, args.rate, args.seconds, args.verbose))


if __name__ == "__main__":
    main()
