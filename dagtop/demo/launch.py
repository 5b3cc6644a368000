"""``dagtop demo``: spawn the demo job's ranks as processes, and record them or watch them live."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dagtop.commands.record import ProgressLine, record
from dagtop.demo.job import MONITOR_PID_ENV
from dagtop.exits import Exit
from dagtop.io.recording import RecordingWriter
from dagtop.io.sources import ANY_LOCAL_PORT, BindError, ZmqSource

DEFAULT_RECORD_ITERATIONS = 50
SILENCE_TIMEOUT_S = 60.0
"""Recording gives up when the job has published nothing for this long (it is starting or stuck)."""
HOST_MEMORY_REUSE = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""glibc settings for the ranks: freed host memory is kept for reuse, as the CUDA caching allocator keeps device
memory. Without them every step's fresh 128 MB gradient of the allreduce demo is mmapped and page-faulted anew,
~80 ms of kernel time per step that a GPU job never pays, and compute would pass for the bottleneck."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for what must be told its port before it binds (torch's
    MASTER_PORT); another process may take it in between."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_endpoint() -> str:
    """An endpoint on a port that was free a moment ago, for tests and benchmarks that name it before they bind it.
    ``dagtop demo`` does not race: it binds :data:`~dagtop.io.sources.ANY_LOCAL_PORT` and tells its ranks the port."""
    return f"tcp://127.0.0.1:{free_port()}"


@dataclass(eq=False)  # a job is itself, not its settings
class DemoJob:
    """The ranks of one demo job, each a ``python -m dagtop.demo.job`` process in its own process group.

    Rank output goes to ``log_path`` (the live screen owns the terminal).
    """

    endpoint: str
    ranks: int = 2
    bottleneck: str = "none"
    straggler: int | None = None
    iterations: int | None = None
    device: str = "cpu"
    granularity: str = "block"
    extra_env: dict[str, str] = field(default_factory=dict)
    """Set in every rank's environment, over the monitor's own."""
    log_path: Path = field(init=False, default_factory=lambda: Path(tempfile.mkdtemp(prefix="dagtop-demo-")) / "job.log")
    _log: IO[bytes] | None = field(init=False, default=None)
    _procs: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "dagtop.demo.job", "--bottleneck", self.bottleneck,
               "--device", self.device, "--granularity", self.granularity]
        if self.straggler is not None:
            cmd += ["--straggler", str(self.straggler)]
        if self.iterations is not None:
            cmd += ["--iterations", str(self.iterations)]
        return cmd

    def placed(self, rank: int, argv: list[str], env: dict[str, str]) -> list[str]:
        """Rank ``rank``'s command line where it runs, its environment amended in place for there: here, as they
        are (a benchmark puts ranks on hosts of their own)."""
        return argv

    def start(self) -> None:
        if self._procs:
            raise RuntimeError("the demo job is already started")
        master_port = self.extra_env.get("MASTER_PORT") or str(free_port())  # given: the job started again
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        for rank in range(self.ranks):
            env = {**HOST_MEMORY_REUSE, **os.environ, **self.extra_env}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.ranks),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port, DAGTOP_ENDPOINT=self.endpoint)
            env[MONITOR_PID_ENV] = str(os.getpid())  # the rank stops when we die, even by SIGKILL
            argv = self.placed(rank, self.command(), env)
            self._procs.append(subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches DataLoader workers too
            ))

    @property
    def running(self) -> bool:
        """True while any rank is alive."""
        return any(p.poll() is None for p in self._procs)

    @property
    def returncodes(self) -> list[int | None]:
        return [p.poll() for p in self._procs]

    def wait(self, timeout: float) -> bool:
        """Wait for every rank to exit; True if they all did within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running

    def stop(self, timeout: float = 10.0) -> list[int | None]:
        """SIGTERM every rank (they stop at the next iteration boundary), SIGKILL what is left after ``timeout``."""
        self._signal(signal.SIGTERM)
        if not self.wait(timeout):
            self._signal(signal.SIGKILL)
            self.wait(5.0)
        if self._log is not None:
            self._log.close()
        return self.returncodes

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _signal(self, signum: int) -> None:
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signum)


def job_from_args(args: argparse.Namespace, endpoint: str) -> DemoJob:
    return DemoJob(endpoint, ranks=args.ranks, bottleneck=args.bottleneck, straggler=args.straggler,
                   iterations=None if args.record else args.iterations, device=args.device,
                   granularity=getattr(args, "granularity", "block"))


def _refusal(args: argparse.Namespace) -> str | None:
    if args.bottleneck == "pcie" and not str(args.device).startswith("cuda"):
        return "--bottleneck pcie needs --device cuda: a CPU job copies nothing over PCIe"
    if args.bottleneck == "allreduce" and args.straggler is not None:
        return "every rank all-reduces the same bytes: --straggler does not apply to --bottleneck allreduce"
    if args.straggler is not None and args.bottleneck == "none":
        return "--straggler needs --bottleneck: say what the rank is slow at (io, compute or pcie)"
    if args.straggler is not None and not 0 <= args.straggler < args.ranks:
        return f"--straggler {args.straggler} is not a rank of a {args.ranks}-rank job"
    if args.ranks < 1:
        return "--ranks must be at least 1"
    return None


def record_demo(job: DemoJob, path: str | os.PathLike[str], iterations: int, progress: ProgressLine | None = None,
                source: ZmqSource | None = None) -> int:
    """Bind first (a late subscriber misses frames), start the job, record ``iterations``, stop; 0 on success.

    Args:
        source: bound already on ``job.endpoint`` (``dagtop demo`` binds before it knows the port); default: bind
            ``job.endpoint`` here, raising :class:`~dagtop.io.sources.BindError` if it cannot.
    """
    if source is None:
        source = ZmqSource(job.endpoint)
    try:
        with RecordingWriter(path) as writer:
            job.start()
            try:
                result = record(source, writer, iterations, SILENCE_TIMEOUT_S, job.ranks, progress,
                                should_stop=lambda: not job.running)
            finally:
                job.stop()
    finally:
        source.close()
    if progress is not None:
        progress.finish(result)
    if result.stopped_because != "iterations":
        print(f"dagtop demo: recording stopped ({result.stopped_because}) after {result.complete} complete "
              f"iterations; job log {job.log_path}:\n{job.log_tail()}", file=sys.stderr)
        return Exit.SHORT
    return Exit.OK


def run_demo(args: argparse.Namespace) -> int:
    """The ``dagtop demo`` command."""
    refusal = _refusal(args)
    if refusal:
        print(f"dagtop demo: {refusal}", file=sys.stderr)
        return Exit.USAGE
    try:  # bound before the ranks start, on the port they are then told: nothing can take it in between
        source = ZmqSource(args.bind or ANY_LOCAL_PORT)
    except BindError as exc:
        print(f"dagtop demo: {exc}", file=sys.stderr)
        return Exit.CANNOT_BIND
    job = job_from_args(args, source.endpoint)
    if args.record:
        iterations = args.iterations or DEFAULT_RECORD_ITERATIONS
        return record_demo(job, args.record, iterations, ProgressLine(), source)
    from dagtop.ui.run import run_demo_live

    return run_demo_live(args, job, source)
