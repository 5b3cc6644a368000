"""The commands that open the screen: ``dagtop`` (live), ``dagtop replay`` and ``dagtop demo``."""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from dagtop.exits import Exit
from dagtop.io.recording import RecordingError
from dagtop.io.sources import FrameSource, RecordingSource, ZmqSource, bind_live
from dagtop.io.telemetry import TelemetrySampler
from dagtop.model.advice_text import terms_of
from dagtop.model.pipeline import Pipeline
from dagtop.ui.app import FRAME_INTERVAL_S, DagtopApp, make_app


def _run(source: FrameSource, **kwargs: Any) -> int:
    """Run the app on ``source`` and release the source and the telemetry afterwards.

    Live, the monitor's machine stands in until the job's ranks send their own telemetry; a replay shows only
    what the recording holds (the monitor's machine has nothing to do with the recorded job).
    """
    sampler = TelemetrySampler() if source.live else None
    try:
        app = make_app(source, sampler=sampler, **kwargs)
        # What is loaded by now (modules, styles) lives as long as the screen: out of the collector's full scans,
        # which otherwise walk it every few seconds while snapshots come and go.
        gc.freeze()
        app.run()
        _write_stats(app)
        return app.return_code or Exit.OK
    finally:
        source.close()
        if sampler is not None:
            sampler.close()


def _write_stats(app: DagtopApp) -> None:
    """With ``DAGTOP_STATS=FILE``, write the screen's counters there on exit (benchmarks/bench_scale.py reads the
    frames drawn); a file that cannot be written is said on stderr and otherwise ignored."""
    path = os.environ.get("DAGTOP_STATS")
    if not path:
        return
    stats = {"refreshes": app.refreshes, "frame_interval_s": app.frame_interval_s}
    try:
        Path(path).write_text(json.dumps(stats) + "\n")
    except OSError as exc:
        print(f"dagtop: DAGTOP_STATS: {exc}", file=sys.stderr)


def run_live(args: argparse.Namespace) -> int:
    """``dagtop [--bind ENDPOINT] [--ranks N]``: bind, then show every rank that publishes there."""
    source = bind_live("dagtop", args.bind, getattr(args, "auth", None))
    if isinstance(source, int):
        return source
    pipeline = Pipeline(expected_ranks=args.ranks, bandwidth_gbps=getattr(args, "bandwidth", None))
    if getattr(args, "metrics_port", None) is None:
        return _run(source, expected_ranks=args.ranks, pipeline=pipeline,
                    frame_interval_s=getattr(args, "refresh", FRAME_INTERVAL_S), cost_terms=terms_of(args))
    from dagtop.interop.metrics import MetricsError, MetricsServer

    # The screen's own pipeline: Prometheus sees what the screen shows.
    try:
        server = MetricsServer(pipeline.snapshot, args.metrics_port, terms_of(args))
    except MetricsError as exc:
        source.close()
        print(f"dagtop: {exc}", file=sys.stderr)
        return Exit.CANNOT_BIND
    try:
        return _run(source, expected_ranks=args.ranks, pipeline=pipeline,
                    frame_interval_s=getattr(args, "refresh", FRAME_INTERVAL_S), cost_terms=terms_of(args))
    finally:
        server.close()


def run_replay(args: argparse.Namespace) -> int:
    """``dagtop replay FILE [--speed X]``: the live screen from a recording."""
    path = Path(args.file)
    if not path.is_file():
        print(f"dagtop replay: {path}: no such file", file=sys.stderr)
        return Exit.BAD_INPUT
    try:
        source = RecordingSource(path, speed=args.speed)
    except (RecordingError, OSError) as exc:
        print(f"dagtop replay: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    speed = "" if args.speed <= 0 else f" ×{args.speed:g}"
    return _run(source, source_label=f"replay {path.name}{speed}",
                pipeline=Pipeline(bandwidth_gbps=getattr(args, "bandwidth", None)),
                frame_interval_s=getattr(args, "refresh", FRAME_INTERVAL_S), cost_terms=terms_of(args))


def run_demo_live(args: argparse.Namespace, job: Any, source: ZmqSource) -> int:
    """``dagtop demo``: start the job on ``source``, bound already (frames sent before the bind are lost), watch,
    stop it on quit."""
    try:
        job.start()
        label = f"demo {args.ranks} ranks · {args.bottleneck}"
        if args.straggler is not None:
            label += f" · straggler {args.straggler}"
        return _run(source, source_label=label, expected_ranks=args.ranks, job=job,
                    job_log=str(getattr(job, "log_path", "")), cost_terms=terms_of(args))
    finally:
        source.close()  # _run has, unless the job failed to start
        codes = job.stop(10.0)
        if any(c not in (Exit.OK, None, -signal.SIGTERM) for c in codes):
            print(f"dagtop demo: the job exited with {codes}; log: {getattr(job, 'log_path', '?')}", file=sys.stderr)
