"""The one entry point of the model: raw frames in, immutable snapshots and per-iteration analyses out."""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Iterable, Mapping

from dagtop.model.admission import Admission, RankState
from dagtop.model.clocks import ClockAligner
from dagtop.model.completion import Completion
from dagtop.model.frames import RawFrame
from dagtop.model.jobs import describe_job
from dagtop.model.liveness import Liveness
from dagtop.model.snapshot import IterationAnalysis, RankInfo, Snapshot
from instrument import wire

TASK_BUDGET = 2_000_000
"""Tasks kept across the retained analyses; past it the oldest analyses give up their ``tasks`` (memory)."""
RUN_SHOWN_S = 60.0
"""The screen says a run began (a restart) for this long."""
OTHER_JOB_SHOWN_S = 10.0
"""The screen says a second job publishes here for this long after its last frame."""
THREAD_CPU_KEPT = 64
"""Iterations whose training threads' CPU times are kept: the advice's window (:data:`dagtop.model.advice.WINDOW`)
and the few iterations still pending after it."""


class Pipeline:
    """Raw frames in, analyses and snapshots out: an :class:`~dagtop.model.admission.Admission` that decides
    which frames to take in, and a :class:`~dagtop.model.completion.Completion` that analyses each iteration
    once its frames are in or it is given up on. Their docstrings give the policy for awkward input (each case
    counted, never raised). Thread-safe: a collector thread feeds it while the screen reads snapshots.
    """

    def __init__(self, window: int | None = 120, expected_ranks: int | None = None,
                 incomplete_after_s: float = 5.0, bandwidth_gbps: float | None = None) -> None:
        self._lock = threading.Lock()
        self._admission = Admission(expected_ranks)
        self._clocks = ClockAligner()
        self.liveness = Liveness()
        """Silent, gone and restarted ranks, and stalls."""
        self._completion = Completion(self._admission, self._clocks, window, int(incomplete_after_s * 1e9),
                                      TASK_BUDGET, bandwidth_gbps, self.liveness.settle)
        self._finished = False
        self._now_ns = 0
        """The monitor's clock as of the latest feed or expiry."""
        self._snapshot: Snapshot | None = None
        self._telemetry_shown: tuple[wire.Telemetry, ...] = ()
        self._buckets: dict[int, wire.Buckets] = {}
        """Each rank's latest bucket map (the advisor regroups it)."""
        self._thread_cpu: dict[int, dict[int, wire.ThreadCpu]] = {}
        """Iteration → rank → its training thread's CPU times, for the last :data:`THREAD_CPU_KEPT` iterations of CPU
        ranks (the advisor prices a step without its all-reduces from them)."""

    # ------------------------------------------------------------------ feeding

    def feed(self, frames: Iterable[RawFrame]) -> None:
        """Fold frames in; analyse every iteration that became complete or was given up on. Never raises."""
        with self._lock:
            for raw in frames:
                for admitted, frame in self._admission.admit(raw):
                    if (s := self._admission.jobs.current(frame)) is not None:  # not a late one of an earlier run
                        ended = s.update_end.get(frame.iteration) if isinstance(frame, wire.IterationBatch) else None
                        self.liveness.take(frame, admitted.received_ns, ended)
                    if isinstance(frame, wire.Hello):
                        self._clocks.hello(frame)
                    elif isinstance(frame, wire.IterationBatch):
                        self._completion.add(admitted, frame)
                        if (cpu := frame.thread_cpu) is not None:
                            self._keep_thread_cpu(frame.iteration, frame.rank, cpu)
                    elif isinstance(frame, wire.Buckets) and frame.buckets:
                        self._buckets[frame.rank] = frame
            self._completion.settle(self._admission.received_ns)
            self.liveness.tick(self._admission.received_ns)
            self._snapshot = None

    def _keep_thread_cpu(self, iteration: int, rank: int, cpu: wire.ThreadCpu) -> None:
        kept = self._thread_cpu
        kept.setdefault(iteration, {})[rank] = cpu
        while len(kept) > THREAD_CPU_KEPT:
            del kept[min(kept)]

    def expire(self, now_ns: int) -> None:
        """Give up on iterations older than ``incomplete_after_s`` at monitor time ``now_ns`` (a quiet live job)."""
        with self._lock:
            self._completion.settle(now_ns)
            self.liveness.tick(now_ns, check_pids=True)  # live: the pids of ranks on this host are current
            self._now_ns = max(self._now_ns, now_ns)
            self._snapshot = None

    def finish(self) -> None:
        """The source is exhausted: analyse what is pending (incomplete where a rank is missing)."""
        with self._lock:
            self._finished = True
            self._completion.finish()
            self.liveness.assess(self._admission.received_ns)  # judged as of the last frame, however recent the last look
            self._snapshot = None

    # ------------------------------------------------------------------ counters

    @property
    def rejected(self) -> int:
        """Frames refused (malformed, wrong wire version, unknown rank, too late) and iterations that failed."""
        return self._admission.rejected

    @property
    def rejections(self) -> Mapping[str, int]:
        """Frames refused so far, by reason with what varies taken out (:func:`~dagtop.model.admission.reason_of`)."""
        return self._admission.rejections

    @property
    def last_rejection(self) -> str | None:
        return self._admission.last_rejection

    @property
    def duplicates(self) -> int:
        return self._admission.duplicates

    @property
    def incomplete(self) -> int:
        """Iterations given up on because a rank's events never came."""
        return self._completion.incomplete

    @property
    def dropped(self) -> int:
        return self._admission.dropped

    # ------------------------------------------------------------------ reading

    def analyses(self) -> list[IterationAnalysis]:
        """All retained analyses, oldest first."""
        with self._lock:
            return list(self._completion.analyses)

    def snapshot(self) -> Snapshot:
        """The current state; built once per change and cached, so polling it is cheap."""
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._build_snapshot()
            return self._snapshot

    def _build_snapshot(self) -> Snapshot:
        admission, analyses = self._admission, self._completion.analyses
        dead = {rank for rank, why in self.liveness.view.gone if why != "said bye"}
        recent = [a.measured_ms for a in analyses[-10:] if a.complete and a.measured_ms > 0]
        notes = list(self._clocks.notes())
        if admission.held:
            notes.append(f"{len(admission.held)} frames held until their process says hello (or one sizes the world)")
        # Ranks on one host share their clock's offset: looked up once a host, not once a rank (each look-up finds
        # the reference host among all the ranks: quadratic in the ranks, 10 ms a snapshot at 1024).
        offsets: dict[str | None, int] = {}
        for r in admission.ranks:
            host = self._clocks.host.get(r)
            if host not in offsets:
                offsets[host] = self._clocks.offset(r)
        liveness = self.liveness.view
        run = admission.jobs.run
        if liveness.restarted and run is not None and run.number and \
                max(self._now_ns, admission.received_ns) - run.opened_ns <= RUN_SHOWN_S * 1e9:
            liveness = dataclasses.replace(liveness, restarted=())  # the run's line says it for all of them
        return Snapshot(
            iterations=tuple(analyses),
            ranks=tuple(self._rank_info(r, s, dead, offsets[self._clocks.host.get(r)])
                        for r, s in sorted(admission.ranks.items())),
            ranks_expected=admission.world or 0,
            iterations_per_s=1000.0 / statistics.median(recent) if recent else 0.0,
            dropped=self.dropped,
            rejected=self.rejected,
            last_rejection=self.last_rejection,
            incomplete=self.incomplete,
            received_ns=admission.received_ns,
            finished=self._finished,
            notes=tuple(notes),
            telemetry=self._latest_telemetry(),
            liveness=liveness,
            losses=admission.losses,
            runs=admission.jobs.run_infos(),
            job_line=self._job_line(),
            buckets=self._buckets[min(self._buckets)] if self._buckets else None,
            thread_cpu=dict(self._thread_cpu),
        )

    def _job_line(self) -> str:
        """A restart within :data:`RUN_SHOWN_S`, and a second job heard within :data:`OTHER_JOB_SHOWN_S`."""
        admission = self._admission
        now = max(self._now_ns, admission.received_ns)
        parts = []
        run = admission.jobs.run
        if run is not None and run.number and now - run.opened_ns <= RUN_SHOWN_S * 1e9:
            parts.append(admission.jobs.run_infos()[-1].line())
        others = admission.jobs.other_jobs_heard(now, OTHER_JOB_SHOWN_S)
        if len(others) == 1:
            parts.append(f"a second job is publishing here: {others[0].frames} frames refused "
                         f"({describe_job(others[0].key)})")
        elif others:
            parts.append(f"{len(others)} other jobs are publishing here: {sum(j.frames for j in others)} frames "
                         "refused")
        return " · ".join(parts)

    def _latest_telemetry(self) -> tuple[wire.Telemetry, ...]:
        """Every rank's latest telemetry by host then rank; the same tuple until one changes (the panel redraws
        on a new one)."""
        latest = tuple(sorted(self._admission.telemetry.values(), key=lambda t: (t.host, t.rank)))
        if latest != self._telemetry_shown:
            self._telemetry_shown = latest
        return self._telemetry_shown

    def _rank_info(self, rank: int, s: RankState, dead: set[int], clock_offset_ns: int) -> RankInfo:
        h = s.hello
        return RankInfo(
            rank=rank,
            host=h.host if h else "?",
            pid=h.pid if h else 0,
            device=h.device if h else "?",
            model=h.model if h else "?",
            params=h.params if h else 0,
            last_iteration=s.last_iteration,
            last_seen_ns=s.last_seen_ns,
            clock_offset_ns=clock_offset_ns,
            connected=s.bye is None and not self._finished and rank not in dead,
            loader=h.loader if h else None,
        )
