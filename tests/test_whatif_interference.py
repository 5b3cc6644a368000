"""The interference fit recovers a known slow-down from synthetic iterations, and the replay applies it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dagtop.model.analysis import analyse
from dagtop.model.change import Change
from dagtop.model.dag import assemble
from dagtop.model.interference import InterferenceFit, compute_factors, fit_groups, node_overlap, task_overlap
from dagtop.model.snapshot import Interference
from dagtop.model.whatif import unexplained
from instrument.events import PHASE_CODE
from instrument.wire import Event

US = 1_000


def iteration(rng: random.Random, k: float, ranks: int = 2) -> dict[int, list[Event]]:
    """One DDP-like iteration: forward, three backward blocks, two buckets; the first bucket's all-reduce overlaps
    a varying share of the later blocks, each slowed by ``(1 + k × overlapped fraction)``."""
    comm_len = rng.randint(500, 6_000)  # µs: how long bucket 0 stays in flight varies from iteration to iteration
    out: dict[int, list[Event]] = {}
    for r in range(ranks):
        evs = [Event("compute", "forward", "net", "main", 0, 3_000 * US, 0)]
        t = 3_000.0
        comm = (t + 2_000, t + 2_000 + comm_len)  # bucket 0 ready after the first block
        for name, base in (("head", 2_000), ("mid", 2_500), ("stem", 3_000)):
            # Slow down by the part of the block under the collective: solve d = base (1 + k·|[t, t+d] ∩ comm| / d).
            d = float(base)
            for _ in range(30):
                over = max(0.0, min(t + d, comm[1]) - max(t, comm[0]))
                d = base * (1 + k * over / d)
            d *= 1 + rng.gauss(0, 0.003)
            evs.append(Event("compute", "backward", name, "main", int(t * US), int((t + d) * US), 0))
            t += d
        end = max(t, comm[1])
        evs.append(Event("allreduce", "allreduce", "bucket 0", "comm", int(comm[0] * US), int(comm[1] * US), 4_000_000))
        evs.append(Event("allreduce", "allreduce", "bucket 1", "comm", int(t * US), int((end + 1_000) * US), 2_000_000))
        evs.append(Event("compute", "update", "optimizer.step", "main", int((end + 1_000) * US),
                         int((end + 2_000) * US), 0))
        out[r] = evs
    return out


@pytest.mark.parametrize("k", [0.0, 0.3, 1.0])
def test_fit_recovers_the_true_factor(k: float) -> None:
    rng = random.Random(7)
    fit = InterferenceFit()
    for _ in range(40):
        events = iteration(rng, k)
        fit.add(assemble(events, {}, {r: 0 for r in events}))
    model = fit.model()
    assert set(model) == {"main"}
    got = model["main"]
    assert got.factor == pytest.approx(k, abs=0.05)
    assert 0 < got.stderr < 0.05
    assert got.samples > 100 and got.blocks >= 3


def test_no_fit_without_varying_overlap() -> None:
    # Every block always fully overlapped or never: interference cannot be told from the block's own length.
    groups = [(np.ones(10), np.full(10, 5.0)), (np.zeros(10), np.full(10, 3.0))]
    assert fit_groups(groups) is None
    assert InterferenceFit().model() == {}


def test_outliers_do_not_move_the_fit() -> None:
    rng = np.random.default_rng(3)
    groups = []
    for base in (1.0, 5.0, 20.0):
        f = rng.uniform(0, 1, 60)
        d = base * (1 + 0.5 * f) * (1 + rng.normal(0, 0.005, 60))
        d[:3] *= 4.0  # the machine busy with something else
        groups.append((f, d))
    got = fit_groups(groups)
    assert got is not None
    assert got[0] == pytest.approx(0.5, abs=0.05)


def test_overlap_fractions_and_factors() -> None:
    events = iteration(random.Random(1), 0.0)
    dag = assemble(events, {}, {r: 0 for r in events})
    frac = task_overlap(dag)
    assert ((frac >= 0) & (frac <= 1 + 1e-9)).all()
    assert frac.max() > 0.1  # some backward block ran under bucket 0
    node = node_overlap(dag)
    assert ((node >= 0) & (node <= 1 + 1e-9)).all()
    same = compute_factors(dag, node, {"main": 0.5}, 1.0)
    assert np.allclose(same, 1.0)  # the collectives as they are: compute as it is
    free = compute_factors(dag, node, {"main": 0.5}, 0.0)
    assert (free <= 1.0).all() and free.min() < 1.0
    dear = compute_factors(dag, node, {"main": 0.5}, 2.0)
    assert (dear >= 1.0 - 1e-12).all()


def test_analysis_applies_the_fit_and_keeps_the_identity() -> None:
    rng = random.Random(11)
    fit = InterferenceFit()
    for _ in range(30):
        events = iteration(rng, 0.6)
        fit.add(assemble(events, {}, {r: 0 for r in events}))
    events = iteration(rng, 0.6)
    origin = {r: 0 for r in events}
    plain = analyse(100, events, {}, origin)
    fitted = analyse(100, events, {}, origin, interference=fit)
    assert fitted.predicted_ms == pytest.approx(fitted.measured_ms, abs=1e-6)  # identity still exact
    assert fitted.interference and fitted.interference[0].factor == pytest.approx(0.6, abs=0.1)
    before = {w.change: w.iteration_ms for w in plain.what_if}
    after = {w.change: w.iteration_ms for w in fitted.what_if}
    assert after[Change.PERFECT_OVERLAP] < before[Change.PERFECT_OVERLAP] - 0.1  # compute freed of the comm
    assert after[Change.ALLREDUCE_DOUBLE] >= before[Change.ALLREDUCE_DOUBLE] - 1e-9
    assert after[Change.IO_HIDDEN] == pytest.approx(before[Change.IO_HIDDEN])  # no overlap changed: untouched


def test_learning_happens_only_when_asked() -> None:
    fit = InterferenceFit()
    events = iteration(random.Random(2), 0.3)
    analyse(1, events, {}, {r: 0 for r in events}, interference=fit)
    assert not fit.blocks
    analyse(1, events, {}, {r: 0 for r in events}, interference=fit, learn=True)
    assert fit.blocks


def test_a_units_forward_and_backward_are_two_blocks() -> None:
    """A unit's forward never runs under a collective and its backward, twice as long, always does, by the same
    fraction: nothing tells interference from noise. Pooled as one block they would read as k ≈ 1."""
    rng = random.Random(9)
    fit = InterferenceFit()
    for _ in range(40):
        events: dict[int, list[Event]] = {}
        for r in range(2):
            fwd, bwd = 1_000 * (1 + rng.gauss(0, 0.02)), 2_000 * (1 + rng.gauss(0, 0.02))
            end = 1_000 + fwd + bwd
            events[r] = [
                Event("compute", "forward", "layer", "main", 0, int(fwd * US), 0),
                Event("compute", "backward", "layer", "main", int(fwd * US), int((fwd + bwd) * US), 0),
                Event("allreduce", "allreduce", "bucket 0", "comm", int((fwd + 100) * US), int(end * US), 1_000_000),
                Event("compute", "update", "optimizer.step", "main", int(end * US), int((end + 200) * US), 0),
            ]
        fit.add(assemble(events, {}, {r: 0 for r in events}))
    assert fit.model() == {}
    assert {(phase, name) for _, _, phase, name in fit.blocks} >= {(PHASE_CODE["forward"], "layer"),
                                                                   (PHASE_CODE["backward"], "layer")}


def test_compute_faster_under_collectives_stops_the_changes_to_communication_only_when_clearly_so() -> None:
    """Significant and large: something else at work, said; small or within the noise: no interference, predicted."""
    def said(k: float, se: float) -> str:
        return unexplained([Interference("main", k, se, 500, 20)])

    assert "compute ran faster while a collective was in flight (main ×0.60 ± 0.05)" in said(-0.4, 0.05)
    assert said(-0.1, 0.01) == ""  # significant, but within what the fit's confounds make of noise on CPU ranks
    assert said(-0.4, 0.3) == ""  # large, but not told from noise
    assert said(0.5, 0.05) == ""
