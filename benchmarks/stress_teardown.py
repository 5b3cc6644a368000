"""Many short instrumented 2-rank jobs, ended every way a job ends, counting the ranks that abort (issue #30).

    python benchmarks/stress_teardown.py                       # 200 jobs, every order in turn (~30 min, 2 cores)
    python benchmarks/stress_teardown.py --jobs 40 --orders raise exit-mid --launcher torchrun --hogs 2

Each job is tests/jobs/teardown.py on 2 gloo ranks, timed by dagtop with a monitor listening on every other job
(a ZeroMQ SUB socket that drains what comes) and none on the others, ended by one of its ``--order``s in turn:
close() then destroy_process_group(), the reverse, neither, an exception or ``sys.exit`` mid-iteration, the job's
own SIGTERM handler, one rank failing. A rank that ends by a signal it did not ask for (SIGABRT: "terminate
called without an active exception"; SIGSEGV) is an abort; so is a job that hangs (killed after ``--timeout``).
``--launcher torchrun`` runs each job under torchrun (which SIGTERMs the other ranks when one fails); ``direct``
spawns the ranks with torchrun's environment, faster. ``--hogs N`` keeps N busy loops running beside the jobs,
the loaded machine where the aborts were seen. Prints a line per order: jobs, exit statuses seen, aborts.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "teardown.py"
sys.path.insert(0, str(ROOT / "tests" / "jobs"))

from teardown import EXPECTED, ORDERS

from dagtop.demo.launch import free_port

ABORTS = (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS, -signal.SIGILL, 128 + signal.SIGABRT,
          128 + signal.SIGSEGV)
"""Exit statuses of a rank that crashed (negative: killed by the signal; 134/139: a shell's way of saying so)."""
CRASH_SAID = ("terminate called", "Fatal Python error", "Signal 6 (SIGABRT)", "Signal 11 (SIGSEGV)")
"""What a crashed rank, or torchrun about one, writes: under torchrun the agent's own status is only 0 or 1."""


def drain(endpoint: str, stop: threading.Event) -> None:
    """A monitor that takes every frame and throws it away."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    while not stop.is_set():
        if sock.poll(200):
            sock.recv()
    sock.close()


def run(order: str, monitor: str | None, launcher: str, timeout: float, log: Path,
        plain: bool = False) -> tuple[list[int], bool, bool]:
    """One job; its ranks' exit statuses (the agent's for torchrun), whether every rank said it was done, and
    whether its output tells of a crash."""
    out = Path(tempfile.mkdtemp(prefix="dagtop-teardown-"))
    env = {**os.environ, "JOB_OUT": str(out), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    env.pop("DAGTOP_DISABLE", None)
    if plain:
        env["DAGTOP_DISABLE"] = "1"
    env["DAGTOP_ENDPOINT"] = monitor or f"tcp://127.0.0.1:{free_port()}"
    port = str(free_port())
    own = out / "job.log"
    with open(own, "wb") as sink:
        if launcher == "torchrun":
            cmds = [([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
                      str(JOB), "--order", order], env)]
        else:
            cmds = [([sys.executable, str(JOB), "--order", order],
                     {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for r in (0, 1)]
        procs = [subprocess.Popen(cmd, env=e, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=out) for cmd, e in cmds]
        deadline = time.monotonic() + timeout
        codes: list[int] = []
        for p in procs:
            try:
                codes.append(p.wait(max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                codes.append(-signal.SIGKILL)
    done = len(list(out.glob("done-*"))) == 2
    said = own.read_bytes()
    crashed = any(words.encode() in said for words in CRASH_SAID)
    with open(log, "ab") as sink:
        sink.write(f"\n===== {order} monitor={bool(monitor)} {time.strftime('%H:%M:%S')}\n".encode() + said)
    for path in [*out.glob("done-*"), own]:
        path.unlink()
    if not any(out.iterdir()):
        out.rmdir()
    else:  # a core dump, where core files are on (ulimit -c)
        print(f"  kept {out}: {sorted(p.name for p in out.iterdir())}", flush=True)
    return codes, done, crashed


def killed_early(launcher: str, order: str) -> bool:
    """torchrun SIGTERMs the other ranks as soon as one fails: in ``raise-one`` they may not get to say done."""
    return launcher == "torchrun" and order == "raise-one"


def hog(stop: threading.Event) -> None:
    """A busy loop in its own process, so that it takes a core (the GIL would keep a thread to one)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    stop.wait()
    proc.kill()
    proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--orders", nargs="+", choices=ORDERS, default=list(ORDERS))
    parser.add_argument("--launcher", choices=("direct", "torchrun"), default="direct")
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside the jobs")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a job counts as hung")
    parser.add_argument("--plain", action="store_true", help="the same jobs untimed (DAGTOP_DISABLE=1)")
    parser.add_argument("--log", default=None, help="the jobs' output (default: a temporary file)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the hogs are stopped on the way
    log = Path(args.log or tempfile.mkstemp(prefix="stress-teardown-", suffix=".log")[1])
    print(f"load average {os.getloadavg()[0]:.2f}; {args.jobs} jobs, launcher {args.launcher}, {args.hogs} hogs; "
          f"log {log}", flush=True)
    stop = threading.Event()
    hogs = [threading.Thread(target=hog, args=(stop,)) for _ in range(args.hogs)]
    monitor = f"tcp://127.0.0.1:{free_port()}"
    drainer = threading.Thread(target=drain, args=(monitor, stop), daemon=True)
    drainer.start()
    for t in hogs:
        t.start()
    expected = EXPECTED if args.launcher == "direct" else {o: {0} if c == {0} else {1} for o, c in EXPECTED.items()}
    seen: dict[str, collections.Counter[tuple[int, ...]]] = collections.defaultdict(collections.Counter)
    aborts: dict[str, int] = collections.Counter()
    unexpected: dict[str, int] = collections.Counter()
    started = time.monotonic()
    try:
        for n, order in zip(range(args.jobs), itertools.cycle(args.orders)):
            codes, done, crashed = run(order, monitor if n % 2 == 0 else None, args.launcher, args.timeout, log,
                                       args.plain)
            seen[order][tuple(codes)] += 1
            if crashed or any(code in ABORTS or code == -signal.SIGKILL for code in codes):
                aborts[order] += 1
                print(f"  job {n} ({order}): ranks ended {codes} — abort (see {log})", flush=True)
            elif (not done and not killed_early(args.launcher, order)) or not all(c in expected[order] for c in codes):
                unexpected[order] += 1
                print(f"  job {n} ({order}): ranks ended {codes}, done: {done} — unexpected", flush=True)
    finally:
        stop.set()
        for t in hogs:
            t.join()
    print(f"{'order':<18} {'jobs':>5} {'aborts':>7} {'unexpected':>11}  exit statuses (count)")
    for order in args.orders:
        statuses = ", ".join(f"{list(k)} ×{v}" for k, v in sorted(seen[order].items()))
        print(f"{order:<18} {sum(seen[order].values()):>5} {aborts[order]:>7} {unexpected[order]:>11}  {statuses}")
    total = sum(sum(c.values()) for c in seen.values())
    print(f"{'all':<18} {total:>5} {sum(aborts.values()):>7} {sum(unexpected.values()):>11}  "
          f"in {time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
