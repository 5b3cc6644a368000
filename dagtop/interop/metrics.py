"""Prometheus metrics of a live job, served over HTTP by ``dagtop --metrics-port`` and ``dagtop record
--metrics-port`` (names and meanings in docs/metrics.md).

Nothing is counted on the side: at each scrape the collector reads the pipeline's latest snapshot (a locked,
cached read) and turns it into metric families, so the figures are exactly what the screen and ``report`` say.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from dagtop.io.sources import FrameSource
from dagtop.model.advice_text import advice_of
from dagtop.model.analysis import segments_ms
from dagtop.model.cost import NO_TERMS, CostTerms
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import Snapshot
from instrument.events import CATEGORIES

WINDOW = 20
"""Complete iterations the critical-path shares and the rates are taken over: the steady verdict's window."""


class SnapshotCollector(Collector):
    """The metric families of the newest snapshot, built at scrape time."""

    def __init__(self, snapshot: Callable[[], Snapshot], terms: CostTerms = NO_TERMS) -> None:
        self._snapshot = snapshot
        self._terms = terms
        self._advised: tuple[Snapshot, list[Any]] | None = None
        """The advice's families and the snapshot they were made from: made again only for a new snapshot."""

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        if self._advised is None or self._advised[0] is not snap:
            self._advised = (snap, list(advice_families(snap, self._terms)))
        recent = [a for a in snap.iterations if a.complete][-WINDOW:]
        latest = recent[-1] if recent else None

        it = GaugeMetricFamily("dagtop_iteration_seconds", "Measured time of the latest complete iteration, "
                               "from the slowest rank's previous update end to its update end")
        predicted = GaugeMetricFamily("dagtop_predicted_iteration_seconds",
                                      "The DAG model's replay of the latest complete iteration")
        exposed = GaugeMetricFamily("dagtop_exposed_communication_seconds",
                                    "Communication of the latest complete iteration not hidden under compute")
        if latest is not None:
            it.add_metric([], latest.measured_ms / 1e3)
            predicted.add_metric([], latest.predicted_ms / 1e3)
            exposed.add_metric([], latest.exposed_comm_ms / 1e3)
        yield from (it, predicted, exposed)

        share = GaugeMetricFamily("dagtop_critical_path_share", f"Share of the critical path per category over the "
                                  f"last {WINDOW} complete iterations (sums to 1)", labels=["category"])
        path_ms = dict.fromkeys(CATEGORIES, 0.0)
        for a in recent:
            for c, ms in segments_ms(a.critical_path).items():
                path_ms[c] = path_ms.get(c, 0.0) + ms
        total = sum(path_ms.values())
        if total > 0:
            for c, ms in path_ms.items():
                share.add_metric([c], ms / total)
        yield share

        steady = latest.steady if latest is not None else None
        rank = GaugeMetricFamily("dagtop_straggler_rank", "The steady verdict's straggler rank, -1 when there is none")
        excess = GaugeMetricFamily("dagtop_straggler_excess_seconds", "The straggler's busy time per iteration over "
                                   "the other ranks' median, labelled with its rank and where it lost the time",
                                   labels=["rank", "category"])
        straggler = steady.straggler if steady is not None else None
        rank.add_metric([], -1 if straggler is None else straggler.rank)
        if straggler is not None:
            excess.add_metric([str(straggler.rank), straggler.category], straggler.busy_excess_ms / 1e3)
        yield from (rank, excess)
        if steady is not None and not steady.gathering:
            bottleneck = GaugeMetricFamily("dagtop_bottleneck", "1 for the steady verdict's bottleneck category (and "
                                           "for the category tied with it)", labels=["category"])
            for category in (steady.bottleneck, steady.tied_with):
                if category is not None:
                    bottleneck.add_metric([category], 1)
            yield bottleneck

        yield CounterMetricFamily("dagtop_dropped_frames", "Frames the ranks discarded or lost on the way",
                                  value=snap.dropped)
        yield CounterMetricFamily("dagtop_rejected_frames", "Frames the monitor refused (malformed, wrong version, "
                                  "unknown rank)", value=snap.rejected)
        yield CounterMetricFamily("dagtop_incomplete_iterations", "Iterations given up on because a rank's events "
                                  "never came", value=snap.incomplete)
        last = GaugeMetricFamily("dagtop_last_iteration", "The newest analysed iteration's number")
        if snap.iterations:
            last.add_metric([], snap.iterations[-1].iteration)
        yield last
        yield GaugeMetricFamily("dagtop_ranks_expected", "Ranks in the job", value=snap.ranks_expected)
        yield GaugeMetricFamily("dagtop_ranks_connected", "Ranks that said hello and not bye",
                                value=sum(r.connected for r in snap.ranks))
        yield GaugeMetricFamily("dagtop_job_running", "1 while a job runs (a rank connected), 0 before the first "
                                "hello and once every rank said bye or its process is gone", value=int(snap.running))
        yield GaugeMetricFamily("dagtop_iterations_per_second", "Iterations per second, job-wide, over the last "
                                "iterations; 0 once the job ended or while an iteration is stalled",
                                value=snap.iterations_per_s_now)
        rates = GaugeMetricFamily("dagtop_rank_iterations_per_second", "Iterations per second of each rank, from "
                                  f"its task ends over the last {WINDOW} iterations", labels=["rank"])
        for r, rate in _rank_rates(snap).items():
            rates.add_metric([str(r)], rate)
        yield rates
        yield from self._advised[1]


def advice_families(snap: Snapshot, terms: CostTerms) -> Iterator[Any]:
    """The advice (what the screen's ``a`` shows): each change's predicted throughput and step, the epoch priced,
    the waste so far."""
    advice, priced = advice_of(snap, snap.iterations, terms)
    held = GaugeMetricFamily("dagtop_advice_held", "1 while nothing is advised (too few steady iterations, or the "
                             "model replays them over 5 % off)")
    held.add_metric([], 1 if advice.held else 0)
    yield held
    labels = ["kind", "change", "confidence"]
    gain = GaugeMetricFamily("dagtop_advice_throughput_ratio", "Samples/s predicted with the change over samples/s "
                             "now, per advised change (fixes and more workers)", labels=labels)
    step = GaugeMetricFamily("dagtop_advice_step_seconds", "The step time predicted with the change", labels=labels)
    best = GaugeMetricFamily("dagtop_advice_best", "1 for the change the advice puts first", labels=["kind", "change"])
    bound = GaugeMetricFamily("dagtop_advice_lower_bound", "1 where the change's throughput ratio is only a lower "
                              "bound (its step and epoch figures upper ones), 0 where it is a point", labels=labels)
    for c in (*advice.fixes, *advice.buys):
        if c.throughput is not None and c.step_ms is not None:
            key = [str(c.kind), c.title, str(c.confidence)]
            gain.add_metric(key, c.throughput)
            step.add_metric(key, c.step_ms / 1e3)
            bound.add_metric(key, 1 if c.lower_bound else 0)
    if advice.best is not None:
        best.add_metric([str(advice.best.kind), advice.best.title], 1)
    yield from (gain, step, best, bound)
    hours = GaugeMetricFamily("dagtop_epoch_gpu_hours", "GPU-hours per epoch now and with each change (needs the "
                              "epoch's length: --epoch-samples or the DataLoader's)", labels=["change"])
    dollars = GaugeMetricFamily("dagtop_epoch_cost_dollars", "Dollars per epoch now and with each change "
                                "(--gpu-hour-price)", labels=["change"])
    if priced.now is not None:
        for name, e in (("now", priced.now), *((c.title, e) for c, e in priced.rows)):
            hours.add_metric([name], e.gpu_hours)
            if e.dollars is not None:
                dollars.add_metric([name], e.dollars)
    yield from (hours, dollars)
    w = priced.waste
    lost = GaugeMetricFamily("dagtop_waste_gpu_hours", "GPU-hours lost over the iterations kept, by cause, each "
                             "alone (they overlap)", labels=["cause"])
    for cause, value in (("communication", w.communication), ("loading", w.loading), ("straggler", w.straggler)):
        lost.add_metric([cause], value)
    yield lost
    yield GaugeMetricFamily("dagtop_observed_gpu_hours", "GPU-hours of the steady iterations kept (what the waste "
                            "is a share of)", value=w.gpu_hours)


def _rank_rates(snap: Snapshot) -> dict[int, float]:
    """Each rank's rate over the window; 0 for a rank no longer connected, and for all once the job stopped."""
    stopped = snap.iterations_per_s_now == 0.0
    connected = {r.rank for r in snap.ranks if r.connected}
    ends: dict[int, list[int]] = {}
    for a in snap.iterations[-WINDOW:]:
        for r, end in a.tasks.last_end_by_rank().items():
            ends.setdefault(r, []).append(end)
    out = {}
    for r, e in ends.items():
        steps = [b - a for a, b in itertools.pairwise(e) if b > a]
        if steps:
            out[r] = 0.0 if stopped or r not in connected else 1e9 / statistics.median(steps)
    return out


class MetricsError(OSError):
    """The metrics endpoint cannot be bound: the message is one line."""


class MetricsServer:
    """An HTTP endpoint (a daemon thread) serving :class:`SnapshotCollector`'s families; :meth:`close` stops it.

    Raises:
        MetricsError: the address cannot be bound.
    """

    def __init__(self, snapshot: Callable[[], Snapshot], address: tuple[str, int],
                 terms: CostTerms = NO_TERMS) -> None:
        from prometheus_client import start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(snapshot, terms))
        host, port = address
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class MeteredSource(FrameSource):
    """A source that also folds every frame into a pipeline of its own and serves its metrics: for ``record``,
    which analyses nothing itself. Closing it stops the server too.

    Raises:
        MetricsError: the address cannot be bound.
    """

    def __init__(self, source: FrameSource, address: tuple[str, int], ranks: int | None = None,
                 terms: CostTerms = NO_TERMS) -> None:
        self.pipeline = Pipeline(expected_ranks=ranks)
        self.server = MetricsServer(self.pipeline.snapshot, address, terms)
        self.source = source
        self.live = source.live

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        frames = self.source.poll(timeout_s, max_frames)
        if frames:
            self.pipeline.feed(frames)
        elif self.source.live:  # a quiet job: give up on iterations a rank never finished, as the screen does
            self.pipeline.expire(time.perf_counter_ns())
        return frames

    @property
    def finished(self) -> bool:
        return self.source.finished

    @property
    def refused(self) -> int:  # type: ignore[override]
        """The wrapped source's count of connections refused by --auth (a FrameSource attribute, not forwarded
        by __getattr__)."""
        return getattr(self.source, "refused", 0)

    def __getattr__(self, name: str) -> Any:  # endpoint, and whatever else the wrapped source offers
        if name == "source":  # not set yet: the server failed to start in __init__
            raise AttributeError(name)
        return getattr(self.source, name)

    def close(self) -> None:
        self.server.close()
        self.source.close()


def parse_address(text: str) -> tuple[str, int]:
    """``PORT`` (every interface, as Prometheus exporters do) or ``HOST:PORT``.

    Raises:
        ValueError: with the reason.
    """
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a port: {text!r} (expected PORT or HOST:PORT, PORT from 1 to 65535)")
    return host.strip("[]") or "0.0.0.0", int(port)
