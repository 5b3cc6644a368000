"""The commands that open the screen: ``dagtop`` (live), ``dagtop replay`` and ``dagtop demo``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dagtop.recording import RecordingError
from dagtop.sources import FrameSource, RecordingSource, ZmqSource
from dagtop.telemetry import TelemetrySampler
from dagtop.ui.app import make_app


def _run(source: FrameSource, **kwargs: Any) -> int:
    """Run the app on ``source`` and release the source and the telemetry afterwards.

    Live, the monitor's machine stands in until the job's ranks send their own telemetry; a replay shows only
    what the recording holds (the monitor's machine has nothing to do with the recorded job).
    """
    sampler = TelemetrySampler() if source.live else None
    try:
        app = make_app(source, sampler=sampler, **kwargs)
        app.run()
        return app.return_code or 0
    finally:
        source.close()
        if sampler is not None:
            sampler.close()


def _bind(endpoint: str) -> ZmqSource | None:
    import zmq

    try:
        return ZmqSource(endpoint)
    except zmq.ZMQError as exc:
        print(f"dagtop: cannot bind {endpoint}: {exc} (is another dagtop running? try --bind)", file=sys.stderr)
        return None


def run_live(args: argparse.Namespace) -> int:
    """``dagtop [--bind ENDPOINT] [--ranks N]``: bind, then show every rank that publishes there."""
    source = _bind(args.bind)
    if source is None:
        return 2
    return _run(source, expected_ranks=args.ranks)


def run_replay(args: argparse.Namespace) -> int:
    """``dagtop replay FILE [--speed X]``: the live screen from a recording."""
    path = Path(args.file)
    if not path.is_file():
        print(f"dagtop replay: {path}: no such file", file=sys.stderr)
        return 2
    try:
        source = RecordingSource(path, speed=args.speed)
    except (RecordingError, OSError) as exc:
        print(f"dagtop replay: {exc}", file=sys.stderr)
        return 2
    speed = "" if args.speed <= 0 else f" ×{args.speed:g}"
    return _run(source, source_label=f"replay {path.name}{speed}")


def run_demo_live(args: argparse.Namespace, job: Any) -> int:
    """``dagtop demo``: bind first (frames sent before the bind are lost), start the job, watch, stop it on quit."""
    source = _bind(args.bind)
    if source is None:
        return 2
    job.start()
    try:
        label = f"demo {args.ranks} ranks · {args.bottleneck}"
        if args.straggler is not None:
            label += f" · straggler {args.straggler}"
        return _run(source, source_label=label, expected_ranks=args.ranks, job=job,
                    job_log=str(getattr(job, "log_path", "")))
    finally:
        codes = job.stop(10.0)
        if any(c not in (0, None, -15) for c in codes):
            print(f"dagtop demo: the job exited with {codes}; log: {getattr(job, 'log_path', '?')}", file=sys.stderr)
