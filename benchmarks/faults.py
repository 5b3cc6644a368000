"""What dagtop keeps and what it loses under real faults, against what the job ran: one table, one row per fault.

Run it once per code tree to compare two versions with the same script (the ranks, the recorder and ``report`` all
run from ``--tree``; this script only drives them and reads what they leave)::

    python benchmarks/faults.py --tree /path/to/older/checkout
    python benchmarks/faults.py                       # this checkout

The job is a small MLP under DDP on gloo, two ranks, paced (``--step-ms``), that writes a line per step it
finished: the truth. Faults:

* ``restart``: ``torchrun --max-restarts 3``, rank 1 killed with ``kill -9`` mid-run; torchrun runs the job
  again.
* ``lossy``: the ranks on one network namespace, the recorder on another, 20 % of the packets dropped each way
  (iptables' statistic match; this kernel has no netem). The job idles a minute after training so that late
  frames can arrive.
* ``cap``: the same link capped at 256 kbit/s (tc tbf), the job sending more than that.
* ``stopped``, ``blocked``: the recorder stopped (SIGSTOP) for 30 s, or its port blocked (iptables DROP) for 30 s;
  the job runs on.
* ``strangers``: a second job's rank and bare frames (a huge world, rank 0 far ahead in sequence, rank 1 at
  iteration 10^12, rank 1's next iterations 4 s long) on the recorder's endpoint for 5 s.
* ``keygen``: ten ``dagtop keygen`` into a 0755 directory under umask 022 while user ``nobody`` tries to read
  the secrets as fast as it can.

Needs root, ``ip``, ``iptables`` and ``tc`` for the network rows (skipped otherwise). Takes ~15 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hosts import Host, two_hosts, why_not_here

from dagtop.demo.launch import free_port
from dagtop.io.recording import read_recording
from instrument import wire

JOB = (ROOT / "tests" / "jobs" / "paced.py").read_text()
COMMON = (ROOT / "tests" / "jobs" / "common.py").read_text()
S = 1e9


class Run:
    """One fault's processes: the job's ranks (torchrun's or our own), a recorder, all killed by group at the end."""

    def __init__(self, tree: Path, work: Path, monitor: Host | None = None, ranks_on: Host | None = None) -> None:
        self.tree, self.work, self.monitor_host, self.ranks_host = tree, work, monitor, ranks_on
        self.out = work / "out"
        self.out.mkdir(parents=True)
        (work / "paced.py").write_text(JOB)
        (work / "common.py").write_text(COMMON)
        self.recording = work / "run.dagtop"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log = open(work / "log", "ab")  # noqa: SIM115 - closed in close()
        self.env = {**os.environ, "PYTHONPATH": f"{tree}:{work}", "JOB_OUT": str(self.out), "OMP_NUM_THREADS": "1",
                    "DAGTOP_TELEMETRY": "0"}
        self.env.pop("DAGTOP_DISABLE", None)

    def start(self, argv: list[str], host: Host | None, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(host.command(argv) if host else argv, env={**self.env, **env}, cwd=self.work,
                                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def recorder(self, endpoint: str) -> subprocess.Popen[bytes]:
        self.endpoint = endpoint
        self.rec = self.start([sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o",
                               str(self.recording), "--timeout", "90"], self.monitor_host)
        time.sleep(1.5)
        return self.rec

    def ranks(self, steps: int, step_ms: float, idle_s: float = 0.0) -> None:
        port = str(free_port())
        for rank in (0, 1):
            self.start([sys.executable, str(self.work / "paced.py"), "--steps", str(steps), "--step-ms", str(step_ms),
                        "--idle-s", str(idle_s)], self.ranks_host, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DAGTOP_ENDPOINT=self.endpoint)

    def steps(self, restart: int = 0, rank: int = 0) -> int:
        path = self.out / f"steps-{restart}-{rank}"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_steps(self, n: int, restart: int = 0) -> None:
        deadline = time.monotonic() + 600
        while min(self.steps(restart, 0), self.steps(restart, 1)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("the job did not start")
            time.sleep(0.1)

    def wait(self, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.log.close()

    def summary(self) -> str:
        """The recorder's last line."""
        lines = [line for line in (self.work / "log").read_text(errors="replace").splitlines()
                 if line.startswith("dagtop record:")]
        return lines[-1] if lines else ""

    def report(self, *args: str) -> dict[str, Any]:
        run = subprocess.run([sys.executable, "-m", "dagtop", "report", "--json", str(self.recording), *args],
                             env=self.env, capture_output=True, text=True, cwd=self.work, check=False)
        return json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr.strip()[-300:]}

    def frames(self) -> list[tuple[int, wire.Frame]]:
        return [(raw.received_ns, wire.decode(raw.payload)) for raw in read_recording(self.recording)]


def _iptables(host: Host, *rule: str) -> None:
    subprocess.run(["ip", "netns", "exec", host.netns, "iptables", *rule], check=True, capture_output=True)


def _iteration_frames(frames: list[tuple[int, wire.Frame]]) -> dict[int, set[int]]:
    got: dict[int, set[int]] = {0: set(), 1: set()}
    for _, f in frames:
        if isinstance(f, wire.IterationBatch) and f.rank in got:
            got[f.rank].add(f.iteration)
    return got


def _counted(s: dict[str, Any]) -> str:
    """What the report says never came: its loss breakdown where it has one, else its `dropped`."""
    if "lost" in s:
        lost = s["lost"]
        return (f"lost {lost['in_transit']} in transit, {lost['rank_socket']} at the socket, {lost['rank_queue']} at "
                f"the queue, {lost['before_connect']} before connect ({lost['iterations_missing']} iteration frames)")
    return f"dropped {s.get('dropped')}"


def restart(tree: Path, work: Path) -> str:
    run = Run(tree, work)
    try:
        run.recorder(f"tcp://127.0.0.1:{free_port()}")
        run.start([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "3",
                   "--master-port", str(free_port()), "--monitor-interval", "0.5", str(work / "paced.py"), "--steps",
                   "300", "--step-ms", "40"], None, DAGTOP_ENDPOINT=run.endpoint)
        run.wait_steps(150)
        os.kill(int((run.out / "pid-0-1").read_text()), signal.SIGKILL)
        run.wait(420)
    finally:
        run.close()
    restarts = sorted({int(p.name.split("-")[1]) for p in run.out.glob("pid-*")})
    ran = sum(min(run.steps(k, 0), run.steps(k, 1)) for k in restarts)
    s = run.report("--iterations", "0:")
    analysed = s.get("iterations", 0)
    return (f"job ran {ran} iterations both ranks finished ({len(restarts)} incarnations); record: {run.summary()}; "
            f"report: {analysed} analysed complete, {s.get('incomplete_iterations')} incomplete, "
            f"{s.get('rejected')} rejected, runs {len(s.get('runs', [])) or 'not said'}")


def _link(tree: Path, work: Path, shape: str) -> str:
    with two_hosts(third_octet=33) as (a, b):
        if shape == "lossy":
            for host in (a, b):
                _iptables(host, "-A", "INPUT", "-i", host.link, "-m", "statistic", "--mode", "random",
                          "--probability", "0.2", "-j", "DROP")
            steps, step_ms, idle_s = 400, 30, 60
        else:
            subprocess.run(["ip", "netns", "exec", a.netns, "tc", "qdisc", "add", "dev", a.link, "root", "tbf",
                            "rate", "256kbit", "burst", "16kb", "latency", "400ms"], check=True)
            steps, step_ms, idle_s = 600, 40, 60
        run = Run(tree, work, monitor=b, ranks_on=a)
        try:
            run.recorder(f"tcp://{b.address}:{free_port()}")
            run.ranks(steps, step_ms, idle_s)
            run.wait()
        finally:
            run.close()
    frames = run.frames()
    got = _iteration_frames(frames)
    ran = min(run.steps(0, 0), run.steps(0, 1))
    missing = sum(ran - len(got[r]) for r in (0, 1))
    arrived: dict[tuple[int, int], int] = {}
    for t, f in frames:
        if isinstance(f, wire.IterationBatch):
            arrived[(f.rank, f.iteration)] = t
    late = max((abs(arrived[(0, i)] - arrived[(1, i)]) for i in got[0] & got[1]), default=0) / S
    s = run.report("--iterations", "0:")
    return (f"job ran {ran}; recorded {len(got[0] & got[1])} with both ranks' frames, {missing} iteration frames "
            f"never came (latest peer {late:.1f} s behind); record: {run.summary()}; report: {s.get('iterations')} "
            f"analysed complete, {s.get('incomplete_iterations')} incomplete, {s.get('rejected')} rejected, "
            f"{_counted(s)}")


def lossy(tree: Path, work: Path) -> str:
    return _link(tree, work, "lossy")


def cap(tree: Path, work: Path) -> str:
    return _link(tree, work, "cap")


def _outage(tree: Path, work: Path, how: str) -> str:
    hosts = two_hosts(third_octet=34) if how == "blocked" else None
    a, b = hosts.__enter__() if hosts else (None, None)
    try:
        port = free_port()
        run = Run(tree, work, monitor=b, ranks_on=a)
        try:
            run.recorder(f"tcp://{b.address if b else '127.0.0.1'}:{port}")
            run.ranks(1800, 40)
            run.wait_steps(150)
            if b is None:
                os.kill(run.rec.pid, signal.SIGSTOP)
            else:
                _iptables(b, "-I", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP")
            time.sleep(30)
            if b is None:
                os.kill(run.rec.pid, signal.SIGCONT)
            else:
                _iptables(b, "-D", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP")
            resumed = time.perf_counter_ns()
            run.wait()
        finally:
            run.close()
    finally:
        if hosts:
            hosts.__exit__(None, None, None)
    frames = run.frames()
    back = []
    for rank in (0, 1):  # the first frame of each rank made after the outage ended (its clock: this machine's)
        fresh = [t for t, f in frames if f.rank == rank and isinstance(f, wire.IterationBatch) and f.events
                 and min(wire.EventColumns.of(f.events).start_ns) >= resumed]
        back.append(f"{(fresh[0] - resumed) / S:.1f} s" if fresh else "never")
    got = _iteration_frames(frames)
    ran = min(run.steps(0, 0), run.steps(0, 1))
    s = run.report()
    stalls = "; ".join(f"rank {x['rank']} silent {x['silent_s']} s in iteration {x['iteration']}"
                       for x in s.get("stalls", [])) or "none"
    return (f"ranks back (a fresh frame) after {', '.join(back)}; stalls reported: {stalls}; job ran {ran}, "
            f"{sum(ran - len(got[r]) for r in (0, 1))} iteration frames never came; {_counted(s)}")


def stopped(tree: Path, work: Path) -> str:
    return _outage(tree, work, "stopped")


def blocked(tree: Path, work: Path) -> str:
    return _outage(tree, work, "blocked")


STRANGERS = (ROOT / "tests" / "test_faults.py").read_text().split('STRANGERS = """')[1].split('"""')[0]


def strangers(tree: Path, work: Path) -> str:
    run = Run(tree, work)
    try:
        run.recorder(f"tcp://127.0.0.1:{free_port()}")
        run.ranks(400, 40)
        run.wait_steps(100)
        # The strangers run from this checkout (the second job's rank uses its shim); bare frames need no tree.
        subprocess.run([sys.executable, "-c", STRANGERS, run.endpoint, "5", str(run.steps(0, 1) + 20)],
                       capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
        run.wait()
    finally:
        run.close()
    s = run.report("--iterations", "0:")
    straggler = s.get("straggler")
    return (f"job ran {min(run.steps(0, 0), run.steps(0, 1))}; report: {s.get('iterations')} analysed complete, "
            f"{s.get('incomplete_iterations')} incomplete, last iteration {s.get('last_iteration')}, median "
            f"{s.get('iteration_ms', {}).get('median', 0):.1f} ms, p90 {s.get('iteration_ms', {}).get('p90', 0):.1f} "
            f"ms, straggler {straggler['rank'] if straggler else 'none'}; record refused {s.get('intake', {}) and s['intake']['rejected']}")


READER = (ROOT / "tests" / "test_keys.py").read_text().split('READER = """')[1].split('"""')[0]
"""User ``nobody`` opening each secret key file the instant it is created (inotify); prints the names it read."""


def keygen(tree: Path, work: Path) -> str:
    """Ten keygens into a 0755 directory while ``nobody`` spins on opening the secret files."""
    nobody = pwd.getpwnam("nobody")
    reads = 0
    for i in range(10):
        keys = work / f"k{i}"
        keys.mkdir(mode=0o755)
        keys.chmod(0o755)
        reader = subprocess.Popen([sys.executable, "-c", READER, str(keys), str(nobody.pw_uid), str(nobody.pw_gid)],
                                  stdout=subprocess.PIPE, text=True)
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
        subprocess.run([sys.executable, "-m", "dagtop", "keygen", str(keys)], cwd=work,  # not the checkout's
                       env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, check=True)
        out, _ = reader.communicate(timeout=120)
        reads += sum(name.endswith("_secret") for name in out.split())
    said = f"secret files read by nobody: {reads} of 20 (10 keygens, two secrets each)"
    if shutil.which("strace"):  # how each secret file is made: the mode it is created with, and any chmod after
        trace = subprocess.run(["strace", "-f", "-e", "trace=openat,chmod,fchmod,fchmodat", sys.executable, "-m",
                                "dagtop", "keygen", str(work / "traced")], cwd=work, capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(tree)}, check=False)
        calls = [line.split("(", 1)[0].split()[-1] + "(" + line.split("(", 1)[1].split(")")[0].split(", ", 2)[-1] + ")"
                 for line in trace.stderr.splitlines() if "monitor.key_secret" in line]
        said += f"; monitor.key_secret made by: {'; '.join(calls)}"
    return said


FAULTS = {"restart": restart, "lossy": lossy, "cap": cap, "stopped": stopped, "blocked": blocked,
          "strangers": strangers, "keygen": keygen}
NEEDS_HOSTS = {"lossy", "cap", "blocked"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose dagtop runs (default: this one)")
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), help="these faults only")
    args = parser.parse_args()
    no_hosts = why_not_here("iptables", "tc")
    print(f"tree {args.tree}; load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for name in args.only or FAULTS:
        if name in NEEDS_HOSTS and no_hosts:
            print(f"{name:<10} skipped: {no_hosts}", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix=f"dagtop-fault-{name}-") as work:
            os.chmod(work, 0o755)
            began = time.monotonic()
            try:
                said = FAULTS[name](args.tree.resolve(), Path(work))
            except Exception as exc:  # noqa: BLE001 - one fault failing must not hide the others' rows
                said = f"failed: {type(exc).__name__}: {exc}"
            print(f"{name:<10} {said} [{time.monotonic() - began:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
