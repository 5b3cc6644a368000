"""The dagtop app and :func:`make_app`, the one factory the CLI, the tests and the screenshot script use."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, Protocol

from textual import work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Footer
from textual.worker import Worker, WorkerState, get_current_worker

from dagtop.exits import Exit
from dagtop.io.sources import FrameSource
from dagtop.io.telemetry import Sampler
from dagtop.model.advice_text import advice_of
from dagtop.model.cost import NO_TERMS, CostTerms
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import EMPTY_SNAPSHOT, IterationAnalysis, Snapshot
from dagtop.ui.collector import Collector
from dagtop.ui.keys import RANK_SCROLL_KEYS, SCREEN_KEYS
from dagtop.ui.renderables.status import job_ended
from dagtop.ui.screens.advice import AdviceScreen
from dagtop.ui.screens.help import HelpScreen
from dagtop.ui.screens.rank_picker import RankPicker
from dagtop.ui.screens.what_if import WhatIfScreen
from dagtop.ui.view import View
from dagtop.ui.widgets.alert import Alert
from dagtop.ui.widgets.history import History
from dagtop.ui.widgets.panel import Panel
from dagtop.ui.widgets.rank_table import RankTable
from dagtop.ui.widgets.status_bar import StatusBar
from dagtop.ui.widgets.telemetry import Telemetry
from dagtop.ui.widgets.timeline import Timeline
from dagtop.ui.widgets.verdict import Verdict
from dagtop.ui.widgets.what_if import WhatIf

FRAME_INTERVAL_S = 1.0
"""How often the panels take a new snapshot: one redraw a second at most, whatever the job's rate (htop redraws
every 1.5 s, nvitop every 2 s). A redraw of every panel costs 15–30 ms of CPU, more with more ranks, on the
training host; a key press redraws at once (benchmarks/bench_monitor.py)."""
LAG_INTERVAL_S = 0.5
"""How often the status line's lag is brought up to date between redraws: it shows the monitor is alive."""


COMPACT_FOOTER_BELOW = 100
"""Narrower than this the footer drops the padding between its keys, so that every key (and "? Help") fits 80."""


class Job(Protocol):
    """What the screen needs of a job it started (the demo's :class:`~dagtop.demo.launch.DemoJob`)."""

    @property
    def running(self) -> bool: ...

    @property
    def returncodes(self) -> list[int | None]: ...


class DagtopApp(App[int]):
    """The live screen. Collecting runs in a thread worker; the UI thread only reads its latest update."""

    CSS_PATH = "dagtop.tcss"
    TITLE = "dagtop"
    ENABLE_COMMAND_PALETTE = False
    # Textual declares these two on App as instance attributes, so a ClassVar here would not type-check.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]  # noqa: RUF012
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [*SCREEN_KEYS, *RANK_SCROLL_KEYS]
    """Declared, each with what the help says of it, in :mod:`dagtop.ui.keys`."""

    paused: reactive[bool] = reactive(False)
    """True while the screen is frozen on one snapshot (collecting goes on underneath)."""
    selected: reactive[int | None] = reactive(None)
    """The iteration number shown while paused; None: the latest."""
    focus_rank: reactive[int | None] = reactive(None)
    """The rank picked with ``r``: drawn first and highlighted."""

    def __init__(self, collector: Collector, *, source_label: str, live: bool, job: Job | None = None,
                 job_log: str = "", waiting_hint: str = "", clock: Callable[[], int] = time.perf_counter_ns,
                 frame_interval_s: float = FRAME_INTERVAL_S, cost_terms: CostTerms = NO_TERMS) -> None:
        super().__init__()
        self.cost_terms = cost_terms
        """What the advice screen prices its changes with (--gpu-hour-price, --epoch-samples, --batch-size)."""
        self.collector = collector
        self.source_label = source_label
        self.live = live
        self.job = job
        self.job_log = job_log
        self.waiting_hint = waiting_hint
        self.clock = clock
        self.frame_interval_s = frame_interval_s
        self.tick_interval_s = min(frame_interval_s, LAG_INTERVAL_S)
        self.ticks_per_frame = max(1, round(frame_interval_s / self.tick_interval_s))
        """Ticks (:meth:`tick`, every ``tick_interval_s``) between two redraws of news: at most one a frame."""
        self._ticks_since_frame = self.ticks_per_frame  # the first news is drawn at once
        self.shown: Snapshot = EMPTY_SNAPSHOT
        """The snapshot on screen (frozen while paused)."""
        self.shown_version = 0
        self.refreshes = 0
        """Times the panels were given a new view (tests and the benchmark read it)."""
        self.job_exited: str | None = None
        self.panels: list[Panel] = []

    def compose(self) -> ComposeResult:
        yield StatusBar(self.source_label, self.live, id="status")
        yield Alert(id="alert")
        yield Verdict(id="verdict")
        yield Timeline(id="timeline")
        with Horizontal(id="middle"):
            yield RankTable(id="ranks")
            yield WhatIf(id="what-if")
        with Horizontal(id="bottom"):
            yield History(id="history")
            yield Telemetry(id="telemetry", live=self.live)
        yield Footer(compact=self.size.width < COMPACT_FOOTER_BELOW)

    def on_resize(self) -> None:
        self.query_one(Footer).compact = self.size.width < COMPACT_FOOTER_BELOW

    def on_mount(self) -> None:
        titles = {"ranks": "ranks", "history": "history · iteration time by critical-path category",
                  "what-if": "what if… (w)", "timeline": "timeline"}  # the telemetry panel titles itself
        for widget_id, title in titles.items():
            self.query_one(f"#{widget_id}").border_title = title
        # Held, not queried per tick: the frame timer may fire once more while the app tears its widgets down.
        self.status_bar = self.query_one(StatusBar)
        self.telemetry_panel = self.query_one(Telemetry)
        self.alert = self.query_one(Alert)
        self.panels = list(self.query(Panel))
        self.alert.say(None)
        self._push_view()
        self.collect()
        self.set_interval(self.tick_interval_s, self.tick)
        if self.job is not None:
            self.set_interval(0.5, self.check_job)

    # ------------------------------------------------------------------ the collector and the frame clock

    @work(thread=True, exclusive=True, exit_on_error=False, name="collector", group="collector")
    def collect(self) -> None:
        """Poll the source and fold frames in, off the UI thread, until the app ends."""
        worker = get_current_worker()
        self.collector.run(lambda: worker.is_cancelled)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name == "collector" and event.state == WorkerState.ERROR:
            self.alert.say(f"collecting stopped: {event.worker.error}")

    def tick(self) -> None:
        """Every tick: keep the lag current; once per frame interval, take the collector's latest update if new."""
        update = self.collector.latest
        self._ticks_since_frame += 1
        if update.version != self.shown_version and self._ticks_since_frame >= self.ticks_per_frame:
            self._ticks_since_frame = 0
            self.shown_version = update.version
            telemetry = self.telemetry_panel
            if update.telemetry is not telemetry.sample:
                telemetry.sample = update.telemetry
            if update.snapshot.telemetry is not telemetry.job:  # the job's own, never frozen by a pause
                telemetry.job = update.snapshot.telemetry
            if not self.paused and update.snapshot is not self.shown:
                self.shown = update.snapshot
                self._push_view()
            if update.error:
                self.alert.say(update.error)
        if self.live:
            received = update.snapshot.received_ns
            lag = (self.clock() - received) / 1e9 if received else None
            status = self.status_bar
            if job_ended(update.snapshot, True, status.job_exited):  # the lag would only grow: say when it ended
                if status.ended_at is None and lag is not None:
                    status.ended_at = time.strftime("%H:%M:%S", time.localtime(time.time() - lag))
                lag = None
            elif status.ended_at is not None:  # ranks again (an elastic restart): the job runs
                status.ended_at = None
            if lag is None or status.lag_s is None or abs(lag - status.lag_s) >= 0.01:
                status.lag_s = lag

    def shown_analysis(self) -> IterationAnalysis | None:
        """The iteration the panels show: the selected one while paused, else the latest."""
        iterations = self.shown.iterations
        if self.selected is not None:
            for a in iterations:
                if a.iteration == self.selected:
                    return a
        return iterations[-1] if iterations else None

    def _push_view(self) -> None:
        view = View(self.shown, self.shown_analysis(), self.focus_rank, self.paused, self.waiting_hint)
        for panel in self.panels:
            if panel.drawn_from(view) != panel.drawn_from(panel.view):
                panel.view = view
        self.refreshes += 1

    def check_job(self) -> None:
        """Say so on screen, once, when the job started for the demo has exited."""
        if self.job is None or self.job_exited is not None or self.job.running:
            return
        codes = self.job.returncodes
        how = "finished" if all(c == Exit.OK for c in codes) else f"died (exit codes {codes})"
        self.job_exited = f"the demo job {how}" + (f" · log: {self.job_log}" if self.job_log else "")
        self.alert.say(self.job_exited)
        self.status_bar.job_exited = True

    # ------------------------------------------------------------------ keys

    def watch_paused(self, paused: bool) -> None:
        if not paused:
            self.selected = None
            latest = self.collector.latest.snapshot
            if latest is not self.shown:
                self.shown = latest
        self._push_view()

    def watch_focus_rank(self) -> None:
        self._push_view()

    def watch_selected(self) -> None:
        self._push_view()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused

    def action_step(self, delta: int) -> None:
        """Browse iterations: ← pauses first; → past the newest does nothing."""
        if not self.paused:
            if delta > 0:
                return
            self.paused = True
        numbers = [a.iteration for a in self.shown.iterations]
        if not numbers:
            return
        current = self.selected if self.selected in numbers else numbers[-1]
        index = min(max(numbers.index(current) + delta, 0), len(numbers) - 1)
        self.selected = numbers[index]

    def action_pick_rank(self) -> None:
        analysis = self.shown_analysis()
        if analysis is None:
            self.notify("no rank has sent an iteration yet")
            return

        def picked(rank: int | None) -> None:
            if rank != -1:
                self.focus_rank = rank

        self.push_screen(RankPicker(analysis.per_rank, self.focus_rank), picked)

    def action_what_if(self) -> None:
        analysis = self.shown_analysis()
        if analysis is None:
            self.notify("no iteration analysed yet")
            return
        self.push_screen(WhatIfScreen(analysis))

    def action_advice(self) -> None:
        shown = self.shown_analysis()
        if shown is None:
            self.notify("no iteration analysed yet")
            return
        # As of the iteration shown: browsing back gives the advice as it stood then.
        analyses = [a for a in self.shown.iterations if a.iteration <= shown.iteration]
        self.push_screen(AdviceScreen(*advice_of(self.shown, analyses, self.cost_terms)))

    def action_sort_ranks(self) -> None:
        self.query_one(RankTable).cycle_sort()

    def action_scroll_ranks(self, delta: int, pages: bool = False) -> None:
        self.query_one(RankTable).scroll_rows(delta, pages)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def make_app(source: FrameSource, *, source_label: str | None = None, expected_ranks: int | None = None,
             sampler: Sampler | None = None, pipeline: Pipeline | None = None, job: Job | None = None,
             job_log: str = "", clock: Callable[[], int] = time.perf_counter_ns,
             frame_interval_s: float = FRAME_INTERVAL_S, cost_terms: CostTerms = NO_TERMS) -> DagtopApp:
    """The app on ``source``: the CLI, the tests and the screenshot script all build it here.

    Args:
        source: a live :class:`~dagtop.io.sources.ZmqSource` or a :class:`~dagtop.io.sources.RecordingSource`.
        source_label: how the status line names the source (default: its endpoint or file).
        expected_ranks: ranks to wait for (default: the ranks' hellos say).
        sampler: telemetry; tests pass a fake so screenshots do not depend on the machine.
        clock: monotonic ns for lag, the clock the live source stamps frames with.
    """
    endpoint = getattr(source, "endpoint", None)
    if source_label is None:
        path = getattr(getattr(source, "reader", None), "path", None)
        source_label = f"live {endpoint}" if source.live else f"replay {path}"
    if not source.live:
        hint = "reading the recording…"
    elif job is not None:  # the demo started its own ranks: nothing for the user to run
        ranks = f"{expected_ranks} " if expected_ranks else ""
        hint = f"starting the {ranks}demo ranks (torch takes a few seconds to load)…"
    elif endpoint:
        hint = f"waiting for ranks to publish to {endpoint} — run them with DAGTOP_ENDPOINT={endpoint}"
    else:
        hint = "waiting for ranks to publish…"
    collector = Collector(source, pipeline, sampler, clock=clock, expected_ranks=expected_ranks)
    return DagtopApp(collector, source_label=source_label, live=source.live, job=job, job_log=job_log,
                     waiting_hint=hint, clock=clock, frame_interval_s=frame_interval_s, cost_terms=cost_terms)
