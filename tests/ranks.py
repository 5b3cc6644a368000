"""Run a real multi-rank job (a script in tests/jobs/) on this machine, timed by dagtop or plain, and read back
what it left: each rank's losses, the frames it published, the report of those frames.

The framework tests compare one job run twice: ``run_job(script)`` (DAGTOP_DISABLE=1) and ``run_job(script,
endpoint=...)`` with a :class:`conftest.Collector` listening. A job is spawned as one process per rank with
torchrun's environment, each in its own process group so a hung job is killed whole.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from dagtop.commands.cli import main
from dagtop.demo.launch import free_port
from dagtop.io.recording import RecordingWriter
from dagtop.model.frames import RawFrame
from instrument import wire

JOBS = Path(__file__).parent / "jobs"
JOB_TIMEOUT_S = 600.0
"""A 2-rank CPU job of a few iterations takes seconds; a loaded 2-core runner importing transformers, much more."""


@dataclass
class JobRun:
    returncodes: list[int | None]
    losses: dict[int, list[str]]
    """Rank → its losses as ``float.hex`` strings (tests/jobs/common.py)."""
    log: str
    times: dict[int, list[float]]
    """Rank → when each loss came (``perf_counter`` seconds), for the jobs that note it."""

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)


class RunningJob:
    """The ranks of a job started by :func:`start_job`: ``out`` is its JOB_OUT folder."""

    def __init__(self, script: str, args: tuple[str, ...], world: int, endpoint: str | None,
                 env: dict[str, str] | None) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="dagtop-job-"))
        atexit.register(shutil.rmtree, self.out, ignore_errors=True)  # read after wait() by some tests: at exit
        self.log = self.out / "job.log"
        port = str(free_port())
        self.procs: list[subprocess.Popen[bytes]] = []
        with open(self.log, "ab") as sink:
            for rank in range(world):
                rank_env = {**os.environ, **(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank),
                            "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                            "JOB_OUT": str(self.out), "DAGTOP_TELEMETRY": "0", "OMP_NUM_THREADS": "1",
                            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
                if endpoint is None:
                    rank_env["DAGTOP_DISABLE"] = "1"
                else:
                    rank_env["DAGTOP_ENDPOINT"] = endpoint
                    rank_env.pop("DAGTOP_DISABLE", None)
                self.procs.append(subprocess.Popen([sys.executable, str(JOBS / script), *args], env=rank_env,
                                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                                   start_new_session=True))

    def signal(self, rank: int, signum: int) -> None:
        """Send ``signum`` to a rank's process group (the rank and any loader workers)."""
        try:
            os.killpg(self.procs[rank].pid, signum)
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float = JOB_TIMEOUT_S) -> JobRun:
        """Wait for every rank (killing what is left after ``timeout_s``) and read what the job left."""
        try:
            for p in self.procs:
                p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in self.procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        losses, times = {}, {}
        for path in self.out.glob("loss-*.json"):
            losses[int(path.stem.split("-")[1])] = json.loads(path.read_text())
        for path in self.out.glob("times-*.json"):
            times[int(path.stem.split("-")[1])] = json.loads(path.read_text())
        return JobRun([p.returncode for p in self.procs], losses, self.log.read_text(errors="replace"), times)


def start_job(script: str, *args: str, world: int = 2, endpoint: str | None = None,
              env: dict[str, str] | None = None) -> RunningJob:
    """Start ``tests/jobs/<script>`` on ``world`` ranks; timed by dagtop when ``endpoint`` is given, else plain."""
    return RunningJob(script, args, world, endpoint, env)


def run_job(script: str, *args: str, world: int = 2, endpoint: str | None = None,
            env: dict[str, str] | None = None, timeout_s: float = JOB_TIMEOUT_S) -> JobRun:
    """Run ``tests/jobs/<script>`` on ``world`` ranks to its end (see :func:`start_job`)."""
    return start_job(script, *args, world=world, endpoint=endpoint, env=env).wait(timeout_s)


def iterations(frames: list[RawFrame]) -> dict[int, dict[int, wire.IterationBatch]]:
    """Iteration → rank → its batch, from raw frames."""
    out: dict[int, dict[int, wire.IterationBatch]] = defaultdict(dict)
    for raw in frames:
        frame = wire.decode(raw.payload)
        if isinstance(frame, wire.IterationBatch):
            out[frame.iteration][frame.rank] = frame
    return dict(out)


def complete(frames: list[RawFrame], world: int = 2) -> dict[int, dict[int, wire.IterationBatch]]:
    """The iterations every one of ``world`` ranks published."""
    return {it: ranks for it, ranks in iterations(frames).items() if set(ranks) == set(range(world))}


def hellos(frames: list[RawFrame]) -> dict[int, wire.Hello]:
    return {f.rank: f for f in (wire.decode(raw.payload) for raw in frames) if isinstance(f, wire.Hello)}


def report(frames: list[RawFrame], tmp_path: Path, capsys: object) -> dict:  # type: ignore[type-arg]
    """``dagtop report --json`` of the frames, as a dict (docs/report.md)."""
    path = tmp_path / "run.dagtop"
    with RecordingWriter(path) as writer:
        for raw in frames:
            writer.append(raw)
    capsys.readouterr()  # type: ignore[attr-defined]
    assert main(["report", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[attr-defined,no-any-return]
