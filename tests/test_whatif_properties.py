"""Invariants of the critical path and the replay on random consistent WFBP schedules (hypothesis)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagtop.model.analysis import analyse
from dagtop.model.change import Change
from dagtop.model.dag import assemble
from dagtop.model.replay import durations, replay
from dagtop.model.snapshot import WhatIf
from dagtop.model.whatif import CommFit
from instrument.wire import Event

US = 1_000


@st.composite
def schedules(draw: st.DrawFn) -> dict[int, list[Event]]:
    """A consistent multi-rank iteration: per rank a serial main lane with gaps, buckets ready inside the
    backward, collectives that start at the latest ready and run one at a time, updates after the last one.
    Sometimes laid out like a GPU job (copy on the copy stream, compute on the GPU stream, loading on the
    training thread), sometimes with each rank's events arriving out of order."""
    ranks = draw(st.integers(1, 4))
    gpu = draw(st.booleans())
    copy_lane, compute_lane = ("copy", "gpu") if gpu else ("main", "main")
    blocks = draw(st.integers(1, 6))
    buckets = draw(st.integers(1, 3))
    dur = st.integers(1, 5_000)
    gap = st.integers(0, 300)
    events: dict[int, list[Event]] = {}
    ready: dict[int, list[int]] = {}
    bwd_end: dict[int, int] = {}
    for r in range(ranks):
        t = draw(gap)
        evs = []
        for cat, phase, name, lane in (("io", "load", "next", "main"), ("pcie", "h2d", "to_device", copy_lane)):
            d = draw(dur)
            evs.append(Event(cat, phase, name, lane, t * US, (t + d) * US, 0))
            t += d + draw(gap)
        for b in range(blocks):
            d = draw(dur)
            evs.append(Event("compute", "forward", f"b{b}", compute_lane, t * US, (t + d) * US, 0))
            t += d + draw(gap)
        marks = []
        for b in reversed(range(blocks)):
            d = draw(dur)
            evs.append(Event("compute", "backward", f"b{b}", compute_lane, t * US, (t + d) * US, 0))
            marks.append(t + draw(st.integers(0, d)))  # somewhere inside this block
            t += d + draw(gap)
        marks.sort()
        ready[r] = [marks[min(k * len(marks) // buckets, len(marks) - 1)] for k in range(buckets)]
        bwd_end[r] = t
        events[r] = evs
    channel = 0
    for k in range(buckets):
        start = max(max(ready[r][k] for r in range(ranks)), channel)
        end = start + draw(dur)
        channel = end
        for r in range(ranks):
            events[r].append(Event("allreduce", "allreduce", f"bucket {k}", "comm", ready[r][k] * US, end * US,
                                   draw(st.integers(1, 10**7))))
    for r in range(ranks):
        t = max(bwd_end[r], channel) + draw(gap)
        d = draw(dur)
        events[r].append(Event("compute", "update", "optimizer.step", compute_lane, t * US, (t + d) * US, 0))
    if draw(st.booleans()):
        rng = draw(st.randoms(use_true_random=False))
        for evs in events.values():
            rng.shuffle(evs)
    return events


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_path_bounds_shares_and_identity(events: dict[int, list[Event]]) -> None:
    origin = {r: 0 for r in events}
    a = analyse(1, events, {}, origin)
    path_ns = sum(s.end_ns - s.start_ns for s in a.critical_path)
    # The path tiles the replayed iteration, which reproduces the observed one.
    assert path_ns == pytest.approx(a.predicted_ms * 1e6, abs=len(a.critical_path) + 2)
    assert a.predicted_ms == pytest.approx(a.measured_ms, abs=1e-6)
    for r, evs in events.items():
        for lane in {e.lane for e in evs} - {"comm"}:
            lane_busy = sum(e.end_ns - e.start_ns for e in evs if e.lane == lane)
            assert path_ns >= lane_busy - len(a.critical_path) - 2
    everything = sum(e.end_ns - e.start_ns for evs in events.values() for e in evs)
    gaps = sum(s.end_ns - s.start_ns for s in a.critical_path if s.phase == "gap")
    assert path_ns - gaps <= everything
    assert sum(a.shares.values()) == pytest.approx(1.0)
    assert all(0.0 <= v <= 1.0 for v in a.shares.values())
    # Segments are in time order and do not overlap.
    for s1, s2 in zip(a.critical_path, a.critical_path[1:]):
        assert s1.end_ns <= s2.start_ns + 1
    # Cheaper communication never makes the iteration slower; dearer never faster.
    w = {x.change: x.iteration_ms for x in a.what_if}
    assert w["all-reduce ×0.5"] <= a.predicted_ms + 1e-9 <= w["all-reduce ×2"] + 2e-9
    assert w["perfect overlap"] <= w["all-reduce ×0.5"] + 1e-9
    assert 0.0 <= a.overlap_ratio <= 1.0


@settings(max_examples=100, deadline=None)
@given(schedules())
def test_identity_replay_reproduces_every_node(events: dict[int, list[Event]]) -> None:
    dag = assemble(events, {}, {r: 0 for r in events})
    import numpy as np

    start, end = replay(dag, durations(dag, np.ones((1, len(dag.ranks) + 1, 5))))
    assert np.allclose(start[0], dag.a, atol=1.0)
    assert np.allclose(end[0], dag.b, atol=1.0)


@given(st.lists(st.integers(1_000, 10**8), min_size=2, max_size=20, unique=True),
       st.floats(1e-6, 1e-3), st.floats(1e-11, 1e-8), st.integers(2, 64))
def test_alpha_beta_fit_recovers_the_ring_model(sizes: list[int], alpha: float, beta: float, workers: int) -> None:
    fit = CommFit()
    for m in sizes:
        t = 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * m * beta
        fit.add(workers, m, t)
    model = fit.model()
    assert model is not None
    for m in sizes:
        truth = 2 * (2 * workers - 1) * alpha + 2 * (2 * workers - 1) / (2 * workers) * m * beta
        assert model.seconds(2 * workers, m) == pytest.approx(truth, rel=1e-3)


def test_alpha_beta_fit_degenerate_cases() -> None:
    one = CommFit()
    assert one.model() is None
    one.add(1, 1000, 0.01)
    assert one.model() is None  # one worker: nothing is communicated
    same = CommFit()
    for _ in range(5):
        same.add(4, 1_000_000, 0.003)
    model = same.model()
    assert model is not None and model.alpha_s == 0.0  # one bucket size: all cost per byte
    assert not model.alpha_known and "latency α unknown" in model.describe()
    assert model.seconds(4, 1_000_000) == pytest.approx(0.003)
    same.add(4, 4_000_000, 0.009)  # a second size: now the latency can be told apart
    model = same.model()
    assert model is not None and model.alpha_known and "latency α unknown" not in model.describe()


@settings(max_examples=100, deadline=None)
@given(schedules(), st.floats(0.0, 3.0))
def test_interference_keeps_predictions_monotone(events: dict[int, list[Event]], k: float) -> None:
    """With compute slowed by k under collectives, cheaper communication still never slows the iteration, dearer
    never speeds it up, and the more interference, the more removing communication buys."""
    from dagtop.model.analysis import _busy
    from dagtop.model.whatif import run_scenarios, scenarios

    dag = assemble(events, {}, {r: 0 for r in events})
    origin = max(dag.origin.values())
    busy = _busy(dag)
    cases = scenarios(dag, None, None, busy)
    if not dag.collectives:
        return
    now = (float(dag.b.max()) - origin) / 1e6
    plain = dict(zip((c.change for c in cases), run_scenarios(dag, cases, origin, busy)))
    w = dict(zip((c.change for c in cases), run_scenarios(dag, cases, origin, busy, {"main": k, "gpu": k})))
    assert w["perfect overlap"] <= w["all-reduce ×0.5"] + 1e-9 <= now + 2e-9 <= w["all-reduce ×2"] + 3e-9
    assert w["perfect overlap"] <= plain["perfect overlap"] + 1e-9
    assert w["all-reduce ×0.5"] <= plain["all-reduce ×0.5"] + 1e-9
    assert w["all-reduce ×2"] >= plain["all-reduce ×2"] - 1e-9


@settings(max_examples=100, deadline=None)
@given(schedules(), st.floats(1e-12, 1e-8), st.floats(0.0, 1e-8), st.floats(0.1, 10.0))
def test_network_bandwidth_is_monotone_and_its_bounds_bracket_it(events: dict[int, list[Event]], beta: float,
                                                                  se: float, faster: float) -> None:
    """At the fitted bandwidth the network change is the iteration as it is; more bandwidth never slows it, less
    never speeds it up; the predictions with β ± 1 s.e. bracket the prediction. A β whose standard error is over
    half of it predicts nothing: the change is shown as not predictable, with the reason."""
    from dagtop.model.analysis import _busy
    from dagtop.model.snapshot import AlphaBeta
    from dagtop.model.whatif import run_scenarios, scenarios, what_ifs

    dag = assemble(events, {}, {r: 0 for r in events})
    if len(dag.ranks) < 2 or not dag.collectives:
        return
    origin = max(dag.origin.values())
    busy = _busy(dag)
    now = (float(dag.b.max()) - origin) / 1e6
    comm = AlphaBeta(0.0, beta, se, 10, 3)

    def network(gbps: float) -> WhatIf:
        cases = scenarios(dag, None, comm, busy, gbps)
        return {x.change: x for x in what_ifs(now, cases, run_scenarios(dag, cases, origin, busy))}[
            Change.NETWORK]

    def network_ms(gbps: float) -> tuple[float, tuple[float, float] | None]:
        w = network(gbps)
        return w.iteration_ms, w.bounds_ms

    if se > beta / 2:
        w = network(comm.bus_gbps * (1 + faster))
        assert not w.predictable and "not identified" in w.unpredictable and math.isnan(w.iteration_ms)
        return
    same, _ = network_ms(comm.bus_gbps)
    assert same == pytest.approx(now, abs=1e-6)
    more, bounds = network_ms(comm.bus_gbps * (1 + faster))
    less, _ = network_ms(comm.bus_gbps / (1 + faster))
    assert more <= now + 1e-9 <= less + 2e-9
    if se > 0:
        assert bounds is not None and bounds[0] - 1e-9 <= more <= bounds[1] + 1e-9
    else:
        assert bounds is None


def test_alpha_beta_standard_error_matches_the_scatter() -> None:
    """Noise of known spread around a known line: β's standard error comes out as least squares says it should,
    and β's true value lies within a few of them."""
    import numpy as np

    rng = np.random.default_rng(7)
    workers, alpha, beta, sigma = 4, 50e-6, 1e-9, 200e-6
    sizes = rng.choice([1 << 20, 4 << 20, 16 << 20, 25 << 20], size=400)
    fit = CommFit()
    for m in sizes:
        fit.add(workers, int(m), 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * m * beta
                + rng.normal(0.0, sigma))
    model = fit.model()
    assert model is not None and model.samples == 400 and model.sizes == 4
    per = 2 * (workers - 1) / workers
    expected_se = sigma / np.sqrt(((sizes - sizes.mean()) ** 2).sum()) / per
    assert model.beta_se == pytest.approx(expected_se, rel=0.2)
    assert abs(model.beta_s_per_byte - beta) < 4 * model.beta_se
    assert model.bus_gbps == pytest.approx(1.0, rel=0.02)  # β = 1 ns/byte: 1 GB/s
    lo, hi = model.bus_gbps_range
    assert lo < model.bus_gbps < hi


def test_alpha_beta_exact_fit_has_no_spread() -> None:
    fit = CommFit()
    for m in (1 << 20, 8 << 20, 1 << 20, 8 << 20):
        fit.add(2, m, 1e-4 + m * 2e-9)
    model = fit.model()
    assert model is not None and model.beta_se == pytest.approx(0.0, abs=1e-15)


def _collective(name: str, nbytes: int, ready: tuple[int, int], start: int, end: int) -> Any:
    from dagtop.model.snapshot import Collective

    return Collective(name, nbytes, dict(enumerate(ready)), start, end, 0)


def test_collectives_in_flight_together_are_one_transfer() -> None:
    from dagtop.model.whatif import transfers

    ms = 1_000_000
    together = [_collective("bucket 0", 3 << 20, (10 * ms, 12 * ms), 12 * ms, 200 * ms),
                _collective("bucket 1", 8 << 20, (40 * ms, 50 * ms), 200 * ms, 500 * ms),  # issued before 200 ms
                _collective("bucket 2", 1 << 20, (600 * ms, 601 * ms), 601 * ms, 650 * ms)]  # after: alone
    assert transfers(together) == [(2, 11 << 20, 0.488), (1, 1 << 20, 0.049)]
    # A GPU stream: each kernel starts (is ready) when the one before it ends: every collective alone.
    serial = [_collective(f"bucket {i}", 1 << 20, (i * 10 * ms, i * 10 * ms), i * 10 * ms, (i + 1) * 10 * ms)
              for i in range(3)]
    assert transfers(serial) == [(1, 1 << 20, 0.01)] * 3


def test_two_buckets_sharing_a_link_give_the_link_s_bandwidth() -> None:
    """gloo all-reduces two buckets at once over a 25 MB/s link; the model sees the second start when the first
    ends, so the first looks slow and the second fast. Fitted on the transfers, the bandwidth is the link's;
    fitted on each collective alone, as before, it was not."""
    from dagtop.model.whatif import transfers

    rate = 25e6  # bytes/s: 200 Mbit/s
    fit, alone = CommFit(), CommFit()
    for i in range(20):
        small, big = (3 + i % 3) << 20, (8 + i % 4) << 20
        ready0, ready1 = 40e-3, 70e-3
        # Alone until the second is issued, then each at half the rate until the first is done.
        first_alone = (ready1 - ready0) * rate
        end0 = ready1 + 2 * (small - first_alone) / rate
        end1 = end0 + (big - (end0 - ready1) * rate / 2) / rate
        ns = [int(x * 1e9) for x in (ready0, ready1, end0, end1)]
        cs = [_collective("bucket 0", small, (ns[0], ns[0]), ns[0], ns[2]),
              _collective("bucket 1", big, (ns[1], ns[1]), ns[2], ns[3])]
        for count, nbytes, seconds in transfers(cs):
            fit.add(2, nbytes, seconds, count)
        for c in cs:
            alone.add(2, c.bytes, (c.end_ns - c.start_ns) / 1e9)
    model, naive = fit.model(), alone.model()
    assert model is not None and naive is not None
    assert model.bus_gbps == pytest.approx(rate / 1e9, rel=0.01)
    assert abs(naive.bus_gbps - rate / 1e9) > 0.1 * rate / 1e9  # what the fit per collective made of it


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1_000, 10**8)), min_size=3, max_size=20),
       st.floats(1e-6, 1e-3), st.floats(1e-11, 1e-8))
def test_alpha_beta_fit_recovers_the_ring_model_from_transfers(samples: list[tuple[int, int]], alpha: float,
                                                               beta: float) -> None:
    workers = 4
    fit = CommFit()
    for k, m in samples:
        fit.add(workers, m, k * 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * m * beta, k)
    model = fit.model()
    assert model is not None
    for k, m in samples:  # whatever the fit could tell apart, it reproduces what it saw
        seen = k * 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * m * beta
        assert k * 2 * (workers - 1) * model.alpha_s + 2 * (workers - 1) / workers * m * model.beta_s_per_byte == \
            pytest.approx(seen, rel=1e-3)


@given(st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0]) | st.floats(-1e6, 1e6), min_size=2, max_size=40))
def test_medians_of_the_others_are_each_a_median_of_all_but_one(values: list[float]) -> None:
    import statistics

    import numpy as np

    from dagtop.model.analysis import medians_of_the_others

    got = medians_of_the_others(np.array(values))
    want = [statistics.median(values[:i] + values[i + 1:]) for i in range(len(values))]
    assert np.allclose(got, want)
