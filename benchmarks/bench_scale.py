"""Scale benchmark: many synthetic ranks, through relays, to a real monitor process on a real screen.

    python benchmarks/bench_scale.py [--ranks 64,256,1024] [--tasks 400] [--rate 1] [--relays 8] [--seconds 30]
                                     [--direct] [--shared-sockets]

For each rank count: the monitor runs as a user runs it, ``dagtop --bind … --ranks N --refresh 0.25`` in a 120x36
tmux pane (private server ``tmux -L benchscale``); ``--relays`` ``dagtop relay`` processes sit between it and the
ranks; publisher processes send every rank's frames, each rank on its own PUB socket connected to one relay
(ranks split evenly across relays), one ``iter`` frame of ``--tasks`` events per rank per iteration at ``--rate``
iterations/s (a synthetic WFBP job, dagtop/model/synthetic.py). Every frame is simulated and encoded before the
clock starts: sending is replaying bytes from memory, the least a sender can cost.

Three ways to place the senders, since on a small machine they take the cores the monitor would have:

- default: as deployed, the ranks' frames through ``--relays`` relays, one PUB socket a rank: the monitor, the
  relays and the ranks' sending all on this machine;
- ``--shared-sockets``: the same relays, but each publisher process sends all its ranks over one PUB socket per
  relay: the same frames for the relays and the monitor, the senders' own cost cut to the least;
- ``--direct``: no relays, the publishers send straight to the monitor's socket (with ``--shared-sockets``: over
  one socket each): the monitor side measured alone, with pre-encoded frames, as near as one machine allows.

Measured, over the ``--seconds`` after a ``--warmup``:

- events/s ingested: the events of the iterations the screen advanced over, per second;
- lag p50/p95: sampled 4 times a second from the pane (``iteration N`` on the status line): how long the oldest
  iteration that every rank has sent but the screen does not yet show has waited (0 when it shows the newest);
- views/s: new snapshots the screen drew per second while live (the app's ``refreshes``, written on exit through
  ``DAGTOP_STATS``): at most 1/``--refresh``, and no more than new data comes in (at 1 it/s: about 2, one as an
  iteration's frames start to arrive and one once all have);
- frames/s and key→frame p50/p95: what the screen can draw, asked. For ``--browse`` seconds after the window, the
  benchmark browses iterations with ← and → (the first ← pauses; collecting goes on underneath, as it would for a
  user), sending each key once the pane shows the frame that answers the last: every key redraws every panel on
  another iteration. frames/s is keys answered per second, so tmux's own round trips count against it;
- live sort p50/p95: before browsing, for as long, ``s`` cycles the rank table's sort while the screen stays live
  (new snapshots keep coming): from each key to the frame whose rank table is titled with the new sort;
- the monitor's CPU (% of one core, user+system of its process tree, psutil) and its peak RSS; the relays' and the
  publishers' CPU too, since on a small machine they compete with the monitor for the same cores;
- whether the publishers kept to their schedule (p95 of how late they sent): where they did not, the machine
  could not host the ranks and the monitor both, and the line says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import psutil
from bench_monitor import RANKS_PER_HOST, START_NS, tree_cpu_s

from dagtop.demo.launch import free_endpoint
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.widgets.rank_table import SORTS
from instrument import wire

TMUX_SOCKET = "benchscale"
"""The private tmux server the monitor runs in: nobody else's tmux is touched."""
SETTLE_S = 3.0
"""Seconds between the publishers connecting and the first frame: the subscriptions reach them through the relays."""
FIRST_ITERATION_AT_S = 1.0
SAMPLE_EVERY_S = 0.25
KEY_TIMEOUT_S = 10.0
"""How long browsing waits for the frame that answers a key before it gives up (and counts it inf)."""

_FRAMES: list[list[bytes]] = []
"""Each rank's frames, hello first, set before the publishers fork (they inherit it, nothing is copied)."""


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-L", TMUX_SOCKET, "-f", "/dev/null", *args], capture_output=True, text=True,
                          check=check)


def encode_job(job: SyntheticJob, iterations: int) -> list[list[bytes]]:
    """Every rank's frames in its send order: its hello (seq 0), then one ``iter`` frame per iteration.

    The hellos place the ranks on hosts of their own, 8 ranks a host, as bench_monitor's do: synthetic_frames' name
    this machine, where the monitor would find their made-up process ids gone and call the job ended."""
    by_rank: list[list[bytes]] = [[] for _ in range(job.ranks)]
    for r in range(job.ranks):
        host, local = f"node{r // RANKS_PER_HOST}", r % RANKS_PER_HOST
        by_rank[r].append(wire.encode(wire.Hello(0, r, job.ranks, local, host, 20_000 + r, f"cuda:{local}", "2.13.0",
                                                 "SyntheticNet", 11_000_000, "block", 1_700_000_000 * 10**9,
                                                 START_NS)))
    for frame in synthetic_frames(job, iterations=iterations, start_ns=START_NS):  # the ranks interleaved
        unpacked = msgpack.unpackb(frame.payload)
        if unpacked["k"] == "iter":  # seq from 1: synthetic_frames' hello took 0
            by_rank[unpacked["rank"]].append(frame.payload)
    return by_rank


def publish(endpoints: list[str], ranks: list[int], rate: float, go: Any, lateness: Any,
            shared: bool = False) -> None:
    """One publisher process: ranks ``ranks``, each on its own PUB socket to ``endpoints[rank % len]`` as a rank's
    shim would send; ``shared``: one PUB socket per endpoint for all of them (the cheapest sender: one pipe to
    wake, not one a rank; the frames are the same bytes, and the monitor reads the rank from each frame)."""
    import zmq

    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, len(ranks) + 64)
    by_endpoint: dict[str, Any] = {}
    sockets = {}
    for r in ranks:
        endpoint = endpoints[r % len(endpoints)]
        if not shared or endpoint not in by_endpoint:
            sock = context.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 10_000)
            sock.connect(endpoint)
            by_endpoint[endpoint] = sock
        sockets[r] = by_endpoint[endpoint]
    iterations = len(_FRAMES[ranks[0]]) - 1
    go.wait(120)
    start = time.monotonic()
    late: list[float] = []
    for r in ranks:
        sockets[r].send(_FRAMES[r][0], zmq.NOBLOCK)
    for i in range(iterations):
        due = start + FIRST_ITERATION_AT_S + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        late.append(max(time.monotonic() - due, 0.0))
        for r in ranks:
            try:
                sockets[r].send(_FRAMES[r][i + 1], zmq.NOBLOCK)
            except zmq.Again:  # a rank never blocks: the frame is lost, as the shim would lose it
                pass
    late.sort()
    lateness.value = max(lateness.value, late[int(0.95 * (len(late) - 1))] if late else 0.0)
    for sock in set(sockets.values()):
        sock.close(linger=0)
    context.term()


@dataclasses.dataclass
class Result:
    ranks: int
    events_per_s: float
    lags: list[float]
    views_per_s: float | None
    key_latencies: list[float]
    """Seconds from each browsing key to the frame that answered it."""
    live_key_latencies: list[float]
    """Seconds from each sort key, pressed while live, to the frame that answered it."""
    monitor_cpu: float
    monitor_rss_mb: float
    relays_cpu: float
    publishers_cpu: float
    publishers_late_p95_s: float
    relay_lines: list[str]
    shown: int | None
    """Iterations the screen showed at the end of the window (the newest's number + 1)."""
    sent: int
    """Iterations every rank had sent by then."""

    def pct(self, q: float) -> float:
        return percentile(self.lags, q)

    @property
    def frames_per_s(self) -> float:
        """Browsing keys answered per second, each sent once the one before was answered."""
        return len(self.key_latencies) / sum(self.key_latencies) if self.key_latencies else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


_BROWSED = re.compile(r"iteration (\d+)(?: of (\d+))?")


def _answered_in(session: str, key: str, answered: Callable[[str], bool], first_line: bool) -> float:
    """Send ``key``; seconds until the pane (its first line only, if ``first_line``) shows what ``answered``
    looks for, polled every 5 ms; inf after :data:`KEY_TIMEOUT_S`."""
    lines = ("-S", "0", "-E", "0") if first_line else ()
    sent = time.monotonic()
    tmux("send-keys", "-t", session, key)
    while not answered(tmux("capture-pane", "-p", "-t", session, *lines).stdout):
        if time.monotonic() - sent > KEY_TIMEOUT_S:
            return float("inf")
        time.sleep(0.005)
    return time.monotonic() - sent


def _timed_keys(seconds: float, press: Callable[[int], float]) -> list[float]:
    """``press(k)`` for k = 0, 1, … for ``seconds``, each once the one before was answered; stops at an inf."""
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and (not latencies or latencies[-1] != float("inf")):
        latencies.append(press(len(latencies)))
    return latencies


def browse(session: str, seconds: float) -> list[float]:
    """Step back and forth between the newest two iterations with ← and → for ``seconds``, each key sent once the
    pane shows the frame that answers the one before: seconds from each key to that frame (inf: none came).

    ← shows ``iteration N-1 of N``, → ``iteration N``, N the newest when the first ← paused the screen; a key
    unanswered after :data:`KEY_TIMEOUT_S` ends browsing."""
    newest: list[int] = []

    def back(line: str) -> bool:
        found = _BROWSED.search(line)
        if found and found.group(2) and int(found.group(1)) == int(found.group(2)) - 1:
            newest[:] = [int(found.group(2))]
            return True
        return False

    def forward(line: str) -> bool:
        found = _BROWSED.search(line)
        return bool(found and found.group(2) is None and [int(found.group(1))] == newest)

    return _timed_keys(seconds, lambda k: _answered_in(session, *(("Left", back) if k % 2 == 0 else
                                                                   ("Right", forward)), first_line=True))


def sort_live(session: str, seconds: float) -> list[float]:
    """Cycle the rank table's sort with ``s`` for ``seconds`` while the screen stays live (new snapshots keep
    coming): seconds from each key to the frame whose rank table is titled with the new sort."""
    titles = ["slowest first" if key == "auto" else f"by {key}" for key in SORTS]

    def press(k: int) -> float:
        now, before = titles[(k + 1) % len(titles)], titles[k % len(titles)]
        return _answered_in(session, "s", lambda pane: now in pane and before not in pane, first_line=False)

    return _timed_keys(seconds, press)


def shown_iteration(screen: str) -> int | None:
    found = re.search(r"iteration (\d+)", screen)  # the status line's, the first
    return int(found.group(1)) if found else None


def measure(ranks: int, args: argparse.Namespace, workdir: Path) -> Result:
    blocks = max(1, (args.tasks - 3 - args.buckets) // 2)
    job = SyntheticJob(ranks=ranks, blocks=blocks, buckets=args.buckets, slow_ranks=(ranks // 3,),
                       slow_factor=3.0)
    events = 3 + 2 * blocks + args.buckets
    iterations = int((args.warmup + args.seconds + args.browse + 5) * args.rate) + 1
    t0 = time.monotonic()
    _FRAMES[:] = encode_job(job, iterations)
    print(f"  {ranks} ranks: {iterations} iterations of {events} events a rank encoded in "
          f"{time.monotonic() - t0:.1f} s, {sum(len(f) for f in _FRAMES[0][1:]) / iterations / 1e3:.1f} kB a frame",
          file=sys.stderr, flush=True)

    endpoint = free_endpoint()
    stats = workdir / f"stats{ranks}.json"
    monitor = [sys.executable, "-m", "dagtop", "--bind", endpoint, "--ranks", str(ranks),
               "--refresh", str(args.refresh), "--nice", "0"]
    session = f"scale{ranks}"
    # exec: the pane's process is the monitor itself (Textual draws on stderr: it stays the pane's).
    command = f"exec env -u COLUMNS -u LINES DAGTOP_STATS={shlex.quote(str(stats))} " + shlex.join(monitor)
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", command)
    monitor_process = psutil.Process(int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").stdout.strip()))
    relay_endpoints = [] if args.direct else [free_endpoint() for _ in range(min(args.relays, ranks))]
    relays = [subprocess.Popen([sys.executable, "-m", "dagtop", "relay", "--bind", e, "--to", endpoint,
                                "--every", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for e in relay_endpoints]
    go, late = mp.get_context("fork").Event(), mp.get_context("fork").Value("d", 0.0)
    groups = [list(range(ranks))[g::args.publishers] for g in range(min(args.publishers, ranks))]
    targets = relay_endpoints or [endpoint]  # --direct: the publishers connect to the monitor itself
    publishers = [mp.get_context("fork").Process(target=publish, args=(targets, g, args.rate, go, late,
                                                                       args.shared_sockets), daemon=True)
                  for g in groups]
    relay_lines: list[str] = []
    try:
        time.sleep(args.startup)  # the monitor's imports and bind
        for p in publishers:
            p.start()
        time.sleep(SETTLE_S)
        go.set()
        start = time.monotonic()
        relay_ps = [psutil.Process(r.pid) for r in relays]
        pub_ps = [psutil.Process(p.pid) for p in publishers if p.pid is not None]
        time.sleep(args.warmup)
        cpu = [tree_cpu_s(monitor_process), sum(map(tree_cpu_s, relay_ps)), sum(map(tree_cpu_s, pub_ps))]
        t_begin = time.monotonic()
        shown_begin = shown_iteration(tmux("capture-pane", "-p", "-t", session).stdout)
        lags, rss = [], 0
        while time.monotonic() < t_begin + args.seconds:
            now = time.monotonic()
            shown = shown_iteration(tmux("capture-pane", "-p", "-t", session).stdout)
            # The oldest iteration sent but not shown, and how long ago it was sent (every rank sends at once).
            waiting = 0 if shown is None else shown + 1
            sent_at = start + FIRST_ITERATION_AT_S + waiting / args.rate
            lags.append(max(now - sent_at, 0.0))
            rss = max(rss, sum(p.memory_info().rss for p in [monitor_process, *monitor_process.children(True)]))
            time.sleep(max(SAMPLE_EVERY_S - (time.monotonic() - now), 0.0))
        t_end = time.monotonic()
        screen = tmux("capture-pane", "-p", "-t", session).stdout
        shown_end = shown_iteration(screen)
        status = next((line.strip() for line in screen.splitlines() if "iteration" in line), "?")
        print(f"  {ranks} ranks: the status line at the end: {status}", file=sys.stderr, flush=True)
        if os.environ.get("BENCH_SCALE_SCREEN"):
            print(screen, file=sys.stderr)
        used = [tree_cpu_s(monitor_process) - cpu[0], sum(map(tree_cpu_s, relay_ps)) - cpu[1],
                sum(map(tree_cpu_s, pub_ps)) - cpu[2]]
        live_keys = sort_live(session, args.browse) if args.browse > 0 else []
        browse_at = time.monotonic()
        keys = browse(session, args.browse) if args.browse > 0 else []
        tmux("send-keys", "-t", session, "q")
        try:
            monitor_process.wait(120)  # a monitor far behind finishes its batch first
        except psutil.TimeoutExpired:
            tmux("kill-session", "-t", session, check=False)
        views_per_s = None
        if stats.is_file():
            refreshes = json.loads(stats.read_text())["refreshes"]
            # One view is pushed at mount, before any frame; browsing pushed one a key, and one more as the first
            # key paused the screen (which then takes no new snapshot).
            views_per_s = (refreshes - 1 - (len(keys) + 1 if keys else 0)) / (browse_at - start)
    finally:
        for p in publishers:
            p.terminate()
            p.join(5)
        for r in relays:
            r.terminate()
            try:
                _, err = r.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                r.kill()
                _, err = r.communicate()
            relay_lines += [line for line in err.splitlines() if "forwarded" in line]
        tmux("kill-session", "-t", session, check=False)
    advanced = 0 if shown_begin is None or shown_end is None else shown_end - shown_begin
    window = t_end - t_begin
    return Result(ranks, advanced * ranks * events / window, lags, views_per_s, keys, live_keys, 100 * used[0] / window,
                  rss / 2**20,
                  100 * used[1] / window, 100 * used[2] / window, late.value, relay_lines,
                  None if shown_end is None else shown_end + 1,
                  min(int((t_end - start - FIRST_ITERATION_AT_S) * args.rate) + 1, iterations))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="64,256,1024", help="rank counts, comma separated (default %(default)s)")
    parser.add_argument("--tasks", type=int, default=400,
                        help="events a rank an iteration, about (default %(default)s)")
    parser.add_argument("--buckets", type=int, default=3, help="all-reduce buckets per iteration (default %(default)s)")
    parser.add_argument("--rate", type=float, default=1.0, help="iterations/s every rank sends (default %(default)s)")
    parser.add_argument("--relays", type=int, default=8, help="dagtop relay processes (default %(default)s)")
    parser.add_argument("--direct", action="store_true",
                        help="no relays: the publishers send straight to the monitor (the monitor side alone)")
    parser.add_argument("--shared-sockets", action="store_true",
                        help="each publisher process sends all its ranks over one PUB socket per relay (or to the "
                             "monitor, with --direct), not one socket a rank: the cheapest sender")
    parser.add_argument("--publishers", type=int, default=2, help="publisher processes (default %(default)s)")
    parser.add_argument("--refresh", type=float, default=0.25, help="the monitor's --refresh (default %(default)s)")
    parser.add_argument("--browse", type=float, default=10.0,
                        help="seconds of browsing with ← and → after the window, 0: none (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds sent before measuring (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds measured (default %(default)s)")
    parser.add_argument("--startup", type=float, default=4.0,
                        help="seconds for the monitor to start (default %(default)s)")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("bench_scale: needs tmux")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    route = "no relays (--direct)" if args.direct else f"{args.relays} relays"
    sockets = "one PUB socket per destination (--shared-sockets)" if args.shared_sockets else "one PUB socket a rank"
    print(f"scale: {os.cpu_count()} cores, load average {load}; {args.rate:g} it/s, ~{args.tasks} events a rank, "
          f"{route}, {args.publishers} publisher processes, {sockets}, --refresh {args.refresh:g}; "
          f"{args.seconds:g} s measured after {args.warmup:g} s")
    print(f"{'ranks':>5}  {'events/s':>9}  {'lag p50':>7}  {'lag p95':>7}  {'views/s':>7}  {'frames/s':>8}  "
          f"{'key→frame p50/p95':>17}  {'live sort p50/p95':>17}  {'monitor CPU':>11}  {'RSS MB':>6}  {'relays CPU':>10}  {'pubs CPU':>8}  "
          f"shown/sent  publishers on time")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        try:
            for ranks in (int(r) for r in args.ranks.split(",")):
                r = measure(ranks, args, Path(tmp))
                views = "?" if r.views_per_s is None else f"{r.views_per_s:.2f}"
                keys, live = (f"{percentile(k, 0.5) * 1e3:.0f}/{percentile(k, 0.95) * 1e3:.0f} ms" if k else "-"
                              for k in (r.key_latencies, r.live_key_latencies))
                on_time = ("yes" if r.publishers_late_p95_s < 0.5 else
                           f"NO (p95 {r.publishers_late_p95_s:.1f} s late: this machine cannot host the ranks too)")
                print(f"{r.ranks:>5}  {r.events_per_s:>9.0f}  {r.pct(0.5):>6.2f}s  {r.pct(0.95):>6.2f}s  {views:>7}  "
                      f"{r.frames_per_s:>8.2f}  {keys:>17}  {live:>17}  "
                      f"{r.monitor_cpu:>10.0f}%  {r.monitor_rss_mb:>6.0f}  {r.relays_cpu:>9.1f}%  "
                      f"{r.publishers_cpu:>7.1f}%  {r.shown}/{r.sent}  {on_time}", flush=True)
                for line in r.relay_lines:
                    print(f"       {line}", file=sys.stderr)
        finally:
            tmux("kill-server", check=False)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end: {load}")


if __name__ == "__main__":
    main()
