"""Monitor CPU benchmark: what the live screen and ``dagtop record`` cost the machine they run on.

    python benchmarks/bench_monitor.py [--ranks 2,8,64] [--modes live,record] [--rate 5] [--windows 3]

Publisher processes send every rank's real wire frames over ZeroMQ, each rank on its own PUB socket as a
training rank would: hellos (at attach, 0.2 s and 0.7 s later, then every 2 s, each followed by the rank's
buckets), one ``iter`` frame per iteration at ``--rate`` iterations/s (a synthetic WFBP job, see
dagtop/model/synthetic.py), a heartbeat every second, and telemetry every 2 s (host figures from local rank 0, a GPU on every rank, 8 ranks
a host). The monitor runs as a separate process exactly as a user runs it: ``dagtop --bind … --ranks N`` in a
120x36 tmux pane (private server ``tmux -L benchmon``), or ``dagtop record`` in the same kind of pane. Its CPU is
read from outside with psutil: user+system CPU seconds of the monitor's process tree over a steady window,
divided by the window's wall seconds, is its share of one core. CPU seconds are far less sensitive to other
load on the machine than wall time, but say what the load was (the table prints ``os.getloadavg()``).

"Kept up" compares the iteration the monitor shows at the end (the live status line, or the recorder's count of
complete iterations) with the iterations sent by then: it keeps up if it is within two seconds' worth of them (the
screen redraws once a second); a monitor that falls behind falls further behind with every window.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from dagtop.demo.launch import free_endpoint
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire
from instrument.wire_fields import Bucket, GpuStats, HostStats

TMUX_SOCKET = "benchmon"
"""The private tmux server the monitor runs in: nobody else's tmux is touched."""
RANKS_PER_HOST = 8
START_NS = 1_000_000_000
"""The ranks' perf_counter at attach in the synthetic job (what its hellos and events are stamped against)."""
HELLO_AT_S = (0.0, 0.2, 0.7)
HELLO_EVERY_S = 2.0
TELEMETRY_FIRST_S, TELEMETRY_EVERY_S = 1.0, 2.0
HEARTBEAT_EVERY_S = 1.0
FIRST_ITERATION_AT_S = 1.0


def rank_stream(job: SyntheticJob, rank: int, iterations: list[bytes], rate: float,
                seconds: float) -> list[tuple[float, bytes, bool]]:
    """One rank's frames as (seconds after attach, payload, whether an ``iter`` frame), seq numbered in send order,
    as the shim sends them."""
    host, local = f"node{rank // RANKS_PER_HOST}", rank % RANKS_PER_HOST
    buckets = tuple(Bucket(k, job.bucket_bytes, tuple(f"block{b}.weight" for b in range(k * 2, k * 2 + 2)))
                    for k in range(job.buckets))
    timed: list[tuple[float, int, Any]] = []  # (when, order, frame with seq 0)
    hello_at = list(HELLO_AT_S) + [t * HELLO_EVERY_S for t in range(1, int(seconds / HELLO_EVERY_S) + 1)]
    for t in hello_at:
        timed.append((t, 0, wire.Hello(0, rank, job.ranks, local, host, 20_000 + rank, f"cuda:{local}", "2.13.0",
                                       "SyntheticNet", 11_000_000, "block", 1_700_000_000 * 10**9, START_NS)))
        timed.append((t, 1, wire.Buckets(0, rank, buckets)))
    t, k = TELEMETRY_FIRST_S, 0
    while t < seconds:
        host_stats = HostStats(40.0 + k % 7, 64, 200 * 2**30, 512 * 2**30) if local == 0 else None
        gpu = GpuStats(local, "NVIDIA H100 80GB HBM3", 90.0 + k % 5, 60 * 2**30, 80 * 2**30, 1e9, 2e9, 500.0)
        timed.append((t, 2, wire.Telemetry(0, rank, host, local, START_NS + int(t * 1e9), host_stats, gpu)))
        t, k = t + TELEMETRY_EVERY_S, k + 1
    t = HEARTBEAT_EVERY_S
    while t < seconds:
        iteration = max(0, int((t - FIRST_ITERATION_AT_S) * rate))
        timed.append((t, 2, wire.Heartbeat(0, rank, iteration, "backward block3", 12)))
        t += HEARTBEAT_EVERY_S
    for i, payload in enumerate(iterations):
        timed.append((FIRST_ITERATION_AT_S + i / rate, 3, wire.decode(payload)))
    timed.sort(key=lambda x: (x[0], x[1]))
    return [(when, wire.encode(dataclasses.replace(frame, seq=seq)), order == 3)
            for seq, (when, order, frame) in enumerate(timed)]


def publish(endpoint: str, job: SyntheticJob, ranks: Sequence[int], rate: float, seconds: float,
            go: Any, sent: Any) -> None:
    """Body of one publisher process: the ranks in ``ranks``, each on its own PUB socket; counts iterations sent."""
    import zmq

    iterations = int(seconds * rate) + 1
    by_rank: dict[int, list[bytes]] = {r: [] for r in ranks}
    for frame in synthetic_frames(job, iterations=iterations, hello=False, start_ns=START_NS):
        decoded = wire.decode(frame.payload)
        if decoded.rank in by_rank:
            by_rank[decoded.rank].append(frame.payload)
    context = zmq.Context()
    sockets, merged = {}, []
    for r in ranks:
        sock = context.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(endpoint)
        sockets[r] = sock
        merged += [(when, r, payload, is_iter) for when, payload, is_iter in rank_stream(job, r, by_rank[r], rate, seconds)]
    merged.sort(key=lambda x: x[0])
    go.wait(60)
    start = time.monotonic()
    for when, r, payload, is_iter in merged:
        delay = start + when - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sockets[r].send(payload)
        if is_iter and r == 0:
            sent.value += 1
    for sock in sockets.values():
        sock.close(linger=0)
    context.term()


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-L", TMUX_SOCKET, "-f", "/dev/null", *args], capture_output=True, text=True,
                          check=check)


def tree_cpu_s(process: psutil.Process) -> float:
    """User+system CPU seconds of ``process`` and its live children."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


@dataclasses.dataclass
class Result:
    ranks: int
    mode: str
    percents: list[float]
    shown: int | None
    sent: int

    @property
    def kept_up(self) -> bool:
        return self.shown is not None and self.shown >= self.sent - 1 - self.rate_slack

    rate_slack: int = 0


def shown_iteration(mode: str, screen: str) -> int | None:
    """The newest iteration on screen: ``iteration N`` (live) or the recorder's ``K complete iterations``."""
    if mode == "live":
        found = re.search(r"iteration (\d+)", screen)
        return int(found.group(1)) + 1 if found else None  # iterations count from 0
    counts = re.findall(r"(\d+) complete iterations", screen)
    return int(counts[-1]) if counts else None


def measure(ranks: int, mode: str, args: argparse.Namespace, workdir: Path) -> Result:
    endpoint = free_endpoint()
    job = SyntheticJob(ranks=ranks, blocks=args.blocks, slow_ranks=(ranks // 2,), slow_factor=3.0)
    seconds = args.warmup + args.windows * args.window_s + 5
    monitor = [sys.executable, "-m", "dagtop"]
    if mode == "record":
        monitor += ["record", "--bind", endpoint, "--ranks", str(ranks), "-o", str(workdir / f"r{ranks}.dagtop")]
    else:
        monitor += ["--bind", endpoint, "--ranks", str(ranks)]
    session = f"{mode}{ranks}"
    # exec: the pane's process is the monitor itself; COLUMNS/LINES would override the pane's size.
    command = "exec env -u COLUMNS -u LINES " + " ".join(f"{k}={shlex.quote(v)}" for k, v in args.env) + " " + shlex.join(monitor)
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", command)
    pid = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").stdout.strip())
    process = psutil.Process(pid)
    time.sleep(args.startup)  # imports, bind
    go, sent = mp.Event(), mp.Value("i", 0)
    groups = [list(range(ranks))[g::args.publishers] for g in range(min(args.publishers, ranks))]
    publishers = [mp.Process(target=publish, args=(endpoint, job, g, args.rate, seconds, go, sent), daemon=True)
                  for g in groups]
    for p in publishers:
        p.start()
    time.sleep(max(3.0, ranks / 20))  # each publisher simulates and encodes its frames before the first is sent
    go.set()
    percents = []
    try:
        time.sleep(args.warmup)
        for _ in range(args.windows):
            cpu0, t0 = tree_cpu_s(process), time.monotonic()
            time.sleep(args.window_s)
            cpu1, t1 = tree_cpu_s(process), time.monotonic()
            percents.append(100.0 * (cpu1 - cpu0) / (t1 - t0))
        sent_now = sent.value
        shown = shown_iteration(mode, tmux("capture-pane", "-p", "-t", session).stdout)
    finally:
        for p in publishers:
            p.terminate()
            p.join(5)
        tmux("kill-session", "-t", session, check=False)
    return Result(ranks, mode, percents, shown, sent_now, rate_slack=int(2 * args.rate))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,8,64", help="rank counts, comma separated (default %(default)s)")
    parser.add_argument("--modes", default="live,record", help="live, record or both (default %(default)s)")
    parser.add_argument("--rate", type=float, default=5.0, help="iterations/s every rank sends (default %(default)s)")
    parser.add_argument("--blocks", type=int, default=12, help="timed blocks per rank: %(default)s gives 30 events an "
                        "iteration")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds sent before measuring (default %(default)s)")
    parser.add_argument("--windows", type=int, default=3, help="measuring windows (default %(default)s)")
    parser.add_argument("--window-s", type=float, default=10.0, help="seconds each (default %(default)s)")
    parser.add_argument("--startup", type=float, default=4.0, help="seconds to let the monitor start before sending")
    parser.add_argument("--publishers", type=int, default=2, help="publisher processes (default %(default)s)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the monitor's environment, e.g. DAGTOP_NICE=0")
    args = parser.parse_args()
    args.env = [tuple(e.split("=", 1)) for e in args.env]
    if shutil.which("tmux") is None:
        sys.exit("bench_monitor: needs tmux")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"monitor CPU, % of one core ({os.cpu_count()} cores, load average {load}); {args.rate:g} it/s per rank; "
          f"{args.windows} windows of {args.window_s:g} s after {args.warmup:g} s")
    print(f"{'ranks':>5}  {'mode':<6}  {'CPU % (median)':>14}  {'windows':<22}  kept up")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        try:
            for ranks in (int(r) for r in args.ranks.split(",")):
                for mode in args.modes.split(","):
                    r = measure(ranks, mode, args, Path(tmp))
                    results.append(r)
                    spread = " ".join(f"{p:.1f}" for p in r.percents)
                    kept = f"{'yes' if r.kept_up else 'NO'} ({r.shown} of {r.sent} iterations)"
                    print(f"{r.ranks:>5}  {r.mode:<6}  {statistics.median(r.percents):>13.1f}%  {spread:<22}  {kept}",
                          flush=True)
        finally:
            tmux("kill-server", check=False)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end: {load}")


if __name__ == "__main__":
    main()
