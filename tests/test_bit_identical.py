"""Training is bit-identical with and without dagtop: at a world size where the all-reduce's rounding shows, and
on every kind of job the shim's cost is measured on (benchmarks/job_kinds.py).

DDP's built-in all-reduce multiplies each gradient by 1/P as it copies it into its bucket and sums; a comm hook
(PyTorch's ``allreduce_hook``, and dagtop's timer before it moved under the reducer) copies, divides by P and
sums. For P = 3, x · (1/3) and x / 3 differ in the last bit for many x, and the losses of a few steps later
differ: this test fails on such a timer (checked with the comm-hook timer of commit 6eda914).
"""

from __future__ import annotations

import pytest

from dagtop.demo.launch import free_endpoint
from tests.ranks import run_job

KINDS = ("cnn", "mlp", "loader", "transformer", "layers")
"""benchmarks/job_kinds.py's kinds (not imported: benchmarks/ is not a package)."""


def test_three_ranks_train_bit_identically_with_and_without_dagtop() -> None:
    plain = run_job("loops.py", "--steps", "6", world=3)
    timed = run_job("loops.py", "--steps", "6", world=3, endpoint=free_endpoint())  # nobody listens: all is sent
    assert plain.ok, plain.log
    assert timed.ok, timed.log
    assert sorted(plain.losses) == [0, 1, 2] and all(len(v) == 6 for v in plain.losses.values())
    assert timed.losses == plain.losses, "dagtop changed the training"  # float.hex of every loss, every rank


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_job_trains_bit_identically_with_and_without_dagtop(kind: str) -> None:
    # Beyond the all-reduce: the shim must take nothing from the random streams (the DataLoader seeds its
    # workers from the global generator), nor change what a forward or a step computes.
    plain = run_job("kinds.py", "--kind", kind, "--steps", "4")
    timed = run_job("kinds.py", "--kind", kind, "--steps", "4", endpoint=free_endpoint())
    assert plain.ok, plain.log
    assert timed.ok, timed.log
    assert sorted(plain.losses) == [0, 1] and all(len(v) == 4 for v in plain.losses.values())
    assert len(set(plain.losses[0])) > 1, "the losses do not move: the test would not see a change"
    assert timed.losses == plain.losses, f"dagtop changed the training of the {kind} job"
