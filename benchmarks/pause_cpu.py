"""How much slower a training step's own CPU work runs after a pause, by the pause's length: one process, no DDP.

    python benchmarks/pause_cpu.py [--rounds 30]

The model of benchmarks/advice_jobs.py's 41 small layers trains on one thread; after each step the thread either
goes straight on, or spins (a busy loop on the clock: the core stays the thread's) for 1, 3, 10 or 30 ms, or sleeps
10 ms, or reads every parameter over and over for 10 ms (the weights stay in the caches).
The arms take turns every 5 steps (the first of each run of 5 not counted). Prints per arm the median CPU time
(``time.thread_time_ns``) of the forward (with the loss), the backward and the optimizer's step, and each
against the arm without a pause.

What it is for: benchmarks/synced_cpu.py found a synced DDP step's forward and update slower in CPU time than the
same step's under ``no_sync``, with no collective in flight. A synced step waits for its all-reduces (9-13 ms on the
2-rank 41-layer job); a micro-batch under ``no_sync`` goes straight on. If a pause alone slows the work after it,
the wait is the cause, and gradient accumulation's advice, which prices a micro-batch from synced steps, cannot see
it (dagtop/model/candidate.py's doubt).

Measured (2026-11-28 17:19, this 2-core VM, load 0.0-0.3), CPU ms against no pause (forward 2.74, backward 3.61,
step 1.00): spun 1 ms +2/-1/-3 %, 3 ms +5/+0/-1 %, 10 ms +17/+10/+10 %, 30 ms +28/+19/+20 %; slept 10 ms
+18/+11/+11 %; reading the parameters for 10 ms +14/+7/+10 %. The whole step after a pause of 10 ms or more runs
slower, spun or slept, and nearly as much with the weights read all the while: the caches' losing the model is
not most of it (this VM does not say what is). A synced step pays it after each wait for the all-reduces; a
micro-batch under ``no_sync`` does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import advice_jobs

PAUSES_MS = (1, 3, 10, 30)
STEPS_PER_BLOCK = 5


def pause(arm: str, params: list[torch.Tensor]) -> None:
    """Spin (``spin N``), sleep (``sleep N``) or read every parameter over and over (``read N``) for N ms;
    ``none``: nothing."""
    how, _, ms = arm.partition(" ")
    if how == "sleep":
        time.sleep(int(ms) / 1e3)
        return
    end = time.perf_counter() + int(ms or 0) / 1e3
    while time.perf_counter() < end:
        if how == "read":
            for p in params:
                p.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="blocks of 5 steps per arm")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = advice_jobs.model_of(argparse.Namespace(job="mlp", widths=advice_jobs.SMALL_LAYERS, width=0, depth=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, int(advice_jobs.SMALL_LAYERS.split(",")[0])), torch.randint(16, (32,))
    arms = ["none", *(f"spin {ms}" for ms in PAUSES_MS), "sleep 10", "read 10"]
    cpu = time.thread_time_ns
    phases: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
    for r in range(args.rounds * len(arms)):
        arm = arms[r % len(arms)]
        for i in range(STEPS_PER_BLOCK):
            a = cpu()
            loss = nn.functional.cross_entropy(model(x), y)
            b = cpu()
            optimizer.zero_grad()
            loss.backward()
            c = cpu()
            optimizer.step()
            d = cpu()
            pause(arm, list(model.parameters()))
            if i:
                phases[arm].append(((b - a) / 1e6, (c - b) / 1e6, (d - c) / 1e6))
    medians = {arm: [statistics.median(p[k] for p in steps) for k in range(3)] for arm, steps in phases.items()}
    base = medians["none"]
    print(f"{args.rounds} blocks of {STEPS_PER_BLOCK - 1} counted steps per arm; CPU ms (against no pause)")
    for arm, (fwd, bwd, step) in medians.items():
        against = "" if arm == "none" else "  " + "  ".join(
            f"{name} {m / b - 1:+.0%}" for name, m, b in zip(("forward", "backward", "step"), (fwd, bwd, step), base))
        print(f"  {'after ' + arm + ' ms' if arm != 'none' else 'no pause':<18} forward {fwd:6.2f}  backward "
              f"{bwd:6.2f}  step {step:5.2f}{against}")


if __name__ == "__main__":
    main()
