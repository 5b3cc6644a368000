"""The ``network bandwidth`` what-if against re-runs over a network whose bandwidth really changed.

Two hosts on one machine: two network namespaces joined by a veth pair, whose egress on both ends is shaped by
``tc``'s token bucket (``tbf``) to a rate. Rank 0 runs on host A, rank 1 on host B, so gloo's all-reduce crosses
the shaped link; the monitor (``dagtop record``) runs on host A. The job is ``benchmarks/whatif_job.py``, a small
transformer the project did not tune (about 12 MB of gradients per step).

Each round records the job at ``--rate`` Mbit/s (base) and at twice it (fast), interleaved, fast first every other
round. From the base recording the report gives the fitted bus bandwidth b and the ``network bandwidth`` what-if:

* predicted at 2b, the default: what a user reads before buying a twice faster link;
* predicted at b_fast, the bandwidth the fast run's own fit found: the model given the right bandwidth, so that
  an error in the α-β replay is told apart from a link that does not deliver twice the rate.

Each is compared with the measured speedup, base / fast, medians of the recorded iterations (dagtop on in both,
so its own cost is on both sides). Needs root (namespaces, links, qdiscs); says so and exits 2 otherwise.

Run: ``nice -n 19 python benchmarks/validate_network.py [--rate 400] [--rounds 3] [--iterations 30]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dagtop.commands.report import select
from dagtop.demo.launch import free_port
from dagtop.io.folded import load
from dagtop.model.summary import summarize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hosts import Host, shape, two_hosts, why_not_here  # tests/hosts.py, shared with tests/test_hosts.py


def record(hosts: tuple[Host, Host], iterations: int, path: Path) -> None:
    """The job, rank 0 on host A and rank 1 on host B, recorded by ``dagtop record`` on host A."""
    a, b = hosts
    monitor = f"tcp://{a.address}:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DAGTOP_TELEMETRY": "0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen[bytes]] = []
    log_path = path.with_suffix(".log")
    with open(log_path, "ab") as log:
        def start(argv: list[str], host: Host, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(host.command(argv), env={**env, **(extra or {})}, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
            procs.append(proc)
            return proc

        try:
            recorder = start([sys.executable, "-m", "dagtop", "record", "--bind", monitor, "-o", str(path),
                              "--ranks", "2", "--iterations", str(iterations - 2), "--timeout", "300"], a)
            port = str(free_port())
            for rank, host in enumerate((a, b)):
                start([sys.executable, "-m", "benchmarks.whatif_job", "--iterations", str(iterations)], host,
                      {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": a.address,
                       "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": host.link, "DAGTOP_ENDPOINT": monitor})
            if recorder.wait(600) != 0:
                sys.exit(f"validate_network: the recording failed; log {log_path}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def report(path: Path, bandwidth_gbps: float | None = None) -> dict[str, Any]:
    pipeline, _ = load(str(path), bandwidth_gbps)
    return summarize(select(pipeline.analyses(), None))


def network_row(s: dict[str, Any]) -> dict[str, Any]:
    row = next((w for w in s["what_if"] if w["change"] == "network bandwidth"), None)
    if row is None or s["network"] is None:
        sys.exit(f"validate_network: no network what-if in the report: {s['what_if']}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0, help="the base link rate, Mbit/s (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    why_not = why_not_here("tc")
    if why_not:
        print(f"validate_network: cannot make two hosts joined by a shaped link: {why_not}", file=sys.stderr)
        sys.exit(2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dagtop-network-") as tmp, two_hosts(third_octet=9) as hosts:
        for k in range(args.rounds):
            runs: dict[str, Path] = {}
            for name, mbit in sorted((("base", args.rate), ("fast", 2 * args.rate)), reverse=k % 2 == 1):
                shape(hosts, mbit)
                runs[name] = Path(tmp) / f"{name}{k}.dagtop"
                record(hosts, args.iterations, runs[name])
            base, fast = report(runs["base"]), report(runs["fast"])
            b_base, b_fast = base["network"]["bus_gbps"], fast["network"]["bus_gbps"]
            twice = network_row(base)
            oracle = network_row(report(runs["base"], b_fast))
            measured = base["iteration_ms"]["median"] / fast["iteration_ms"]["median"]
            rows.append({
                "base_ms": base["iteration_ms"]["median"], "fast_ms": fast["iteration_ms"]["median"],
                "b_base": b_base, "b_fast": b_fast, "measured": measured,
                "twice": base["predicted_iteration_ms"] / twice["iteration_ms"],
                "oracle": base["predicted_iteration_ms"] / oracle["iteration_ms"],
            })
            r = rows[-1]
            print(f"round {k}: base {r['base_ms']:.1f} ms/it, bus {b_base * 8000:.0f} Mbit/s fitted; fast "
                  f"{r['fast_ms']:.1f} ms/it, bus {b_fast * 8000:.0f} Mbit/s fitted; speedup measured ×{measured:.3f}, "
                  f"predicted ×{r['twice']:.3f} at 2b, ×{r['oracle']:.3f} at b_fast", flush=True)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    measured = med("measured")
    spread = f"{min(r['measured'] for r in rows):.3f}–{max(r['measured'] for r in rows):.3f}"
    print(f"\ntransformer (benchmarks/whatif_job.py), 2 ranks across a veth link shaped to {args.rate:g} and "
          f"{2 * args.rate:g} Mbit/s, {args.rounds} rounds, {args.iterations} iterations each; medians over rounds")
    print(f"{'prediction':<38} {'predicted':>9} {'measured':>9} {'error':>7}   measured range")
    for label, key in (("network at 2b (the default)", "twice"), ("network at b_fast (the fast run's fit)", "oracle")):
        error = (med(key) - measured) / measured * 100
        print(f"{label:<38} {'×' + format(med(key), '.3f'):>9} {'×' + format(measured, '.3f'):>9} {error:+6.1f} %"
              f"   ×{spread}")
    print(f"fitted bus bandwidth: base {med('b_base') * 8000:.0f} Mbit/s, fast {med('b_fast') * 8000:.0f} Mbit/s "
          f"(link {args.rate:g} and {2 * args.rate:g} Mbit/s)")


if __name__ == "__main__":
    main()
