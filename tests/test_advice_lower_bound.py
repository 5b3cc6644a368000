"""The advice on a figure that is only a lower bound says "at least": a compute straggler on CPU cores other ranks
share (#25's 'straggler at median' with ``lower_bound``) is advised with its gain ``≥``, its step, epoch, GPU-hours
and cost ``≤``, the reason beside it, on the screen, in ``advise``, ``report``, their JSON and Prometheus; and a
lower bound ranked after the best change is said to be one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from rich.console import Console

from dagtop.commands.cli import main
from dagtop.interop.metrics import SnapshotCollector
from dagtop.io.folded import load
from dagtop.io.recording import RecordingWriter
from dagtop.model.advice import Advice, Candidate, Kind, advise
from dagtop.model.advice_text import candidate_rows, cost_rows, waste_line
from dagtop.model.change import Change
from dagtop.model.cost import CostTerms, fix_or_buy
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import IterationAnalysis, Snapshot
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.renderables.advice import AdviceDetails
from instrument import wire

SLOW = SyntheticJob(ranks=3, slow_ranks=(2,), slow_category="compute", slow_factor=3.0)
"""Rank 2 computes three times slower than ranks 0 and 1, all three on the CPU cores of one host."""
TERMS = CostTerms(gpu_hour_price=2.5, epoch_samples=1_281_167, batch_size=32)
WHY = "made by hand: the replay does not count all that the change frees"


def frames(device: str = "cpu") -> list[RawFrame]:
    """The job's frames, its hellos saying ``device``."""
    out = []
    for raw in synthetic_frames(SLOW, iterations=60, seed=3):
        frame = wire.decode(raw.payload)
        if isinstance(frame, wire.Hello) and device != "cpu":
            raw = RawFrame(raw.received_ns, wire.encode(dataclasses.replace(frame, device=device)))
        out.append(raw)
    return out


def snapshot(device: str = "cpu") -> Snapshot:
    p = Pipeline(window=None)
    p.feed(frames(device))
    p.finish()
    return p.snapshot()


def bounded(a: IterationAnalysis) -> IterationAnalysis:
    """The iteration with its 'straggler at median' said to be a lower bound, ``WHY``."""
    return dataclasses.replace(a, what_if=tuple(dataclasses.replace(w, lower_bound=WHY)
                                                if w.change is Change.STRAGGLER_AT_MEDIAN else w for w in a.what_if))


def straggler(advice: Advice) -> Candidate:
    [c] = [c for c in advice.fixes if c.kind is Kind.STRAGGLER]
    return c


def test_a_straggler_from_a_lower_bound_what_if_is_advised_as_at_least_and_priced_at_most() -> None:
    snap = snapshot("cuda:0")  # GPU ranks: the replay is a point
    plain = advise(snap.iterations, snap.ranks, snap.buckets, snap.telemetry)
    point = straggler(plain)
    assert not point.lower_bound and point.gain.startswith("+") and plain.best is point
    least = advise(tuple(map(bounded, snap.iterations)), snap.ranks, snap.buckets, snap.telemetry)
    c = straggler(least)
    # The figure is the replay's, unchanged; only how it reads.
    assert c.lower_bound == WHY and (c.speedup, c.step_ms, c.range_ms) == (point.speedup, point.step_ms, point.range_ms)
    assert c.gain == "≥" + point.gain
    assert least.best is c and least.headline() == (
        f"best change: {c.title} (straggler): throughput at least {point.gain}, step {least.step_ms:.1f} → "
        f"{point.step_ms:.1f} ms or less")
    [row] = [r for r in candidate_rows(least) if r[0] == c.title]
    assert row[1] == f"≤{point.step_ms:.1f}" and row[3] == c.gain
    assert all(not r[1].startswith("≤") for r in candidate_rows(least) if r[0] != c.title)
    # Priced: the same arithmetic as a point (1/throughput of the time, the GPU-hours and the dollars), at most.
    priced = fix_or_buy(least, snap.iterations, snap.ranks, TERMS)
    assert priced.now is not None and c.throughput is not None
    [(_, epoch)] = [(x, e) for x, e in priced.rows if x is c]
    assert epoch.at_most and not any(e.at_most for x, e in priced.rows if x is not c)
    assert epoch.hours == pytest.approx(priced.now.hours / c.throughput)
    assert epoch.dollars == pytest.approx(priced.now.gpu_hours / c.throughput * 2.5)
    [cost] = [r for r in cost_rows(priced) if r[0] == c.title]
    assert all(cell.startswith("≤") for cell in cost[1:]), cost
    # The GPU-hours the straggler cost so far: at least what its replays say.
    lost = fix_or_buy(least, tuple(map(bounded, snap.iterations)), snap.ranks, TERMS).waste
    assert lost.straggler > 0 and lost.straggler_lower_bound == WHY and "straggler ≥" in waste_line(
        dataclasses.replace(priced, waste=lost))
    assert not priced.waste.straggler_lower_bound and "straggler ≥" not in waste_line(priced)


def test_a_lower_bound_ranked_after_the_best_may_gain_more() -> None:
    """Ranked by its least gain, a lower bound stands where that puts it; after the best, the headline says it may
    gain more; first, it leads with 'at least'."""
    workers = Candidate(Kind.LOADER, "num_workers=1", "", {"num_workers": 1}, 66.7, None, 1.5)
    rank = Candidate(Kind.STRAGGLER, "rank 1 to the median", "", {"rank": 1}, 83.3, None, 1.2, lower_bound=WHY)
    advice = Advice(50, 20, 100.0, 0.0, "", (workers, rank))
    assert advice.best is workers and advice.may_gain_more() == [rank]
    assert advice.headline() == ("best change: num_workers=1 (input pipeline): throughput +50 %, step 100.0 → 66.7 "
                                 "ms; rank 1 to the median may gain more (at least +20 %)")
    first = dataclasses.replace(advice, fixes=(dataclasses.replace(rank, speedup=2.0, step_ms=50.0), workers))
    assert first.may_gain_more() == [] and first.headline() == (
        "best change: rank 1 to the median (straggler): throughput at least +100 %, step 100.0 → 50.0 ms or less")
    plain = dataclasses.replace(advice, fixes=(workers, dataclasses.replace(rank, lower_bound="")))
    assert plain.may_gain_more() == [] and "may gain more" not in plain.headline()


def rendered(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [96, 72])  # the advice box at 120×36 and at 80×24
def test_the_screen_says_at_least_and_why(width: int) -> None:
    snap = snapshot()  # CPU ranks on one host: the pipeline itself makes the lower bound
    advice = advise(snap.iterations, snap.ranks, snap.buckets, snap.telemetry)
    c = straggler(advice)
    assert "rank 2 computes on the cores of host" in c.lower_bound and advice.best is c
    priced = fix_or_buy(advice, snap.iterations, snap.ranks, TERMS)
    text = rendered(AdviceDetails(advice, priced), width)
    flat = " ".join(text.split())
    assert "throughput at least" in flat and "ms or less" in flat
    [row] = [line for line in text.splitlines() if line.strip().startswith(c.title) and "min" not in line]
    assert f"≤{c.step_ms:.1f}" in row and c.gain in row, text
    [cost] = [line for line in text.splitlines() if line.strip().startswith(c.title) and "min" in line]
    assert cost.count("≤") == 4, cost
    assert "≥ ≤: a lower bound on the gain, an upper one on the step, the epoch and its cost" in flat
    assert f"predicted at most {c.step_ms:.1f} ms/step" in flat and "at least: rank 2 computes on the cores" in flat
    assert "straggler ≥" in flat
    # Only the straggler's figures are bounds: no other row of the table has a mark.
    for other in (*advice.fixes, *advice.buys):
        if other is not c:
            line = next(x for x in text.splitlines() if x.strip().startswith(other.title))
            assert "≤" not in line and "≥" not in line, line


def scrape(collector: SnapshotCollector) -> dict[str, Metric]:
    return {m.name: m for m in collector.collect()}


def test_report_advise_their_json_and_prometheus_say_at_least(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "straggler.dagtop"
    with RecordingWriter(path) as w:
        for raw in frames():
            w.append(raw)
    terms = ["--gpu-hour-price", "2.5", "--epoch-samples", "1281167", "--batch-size", "32"]
    assert main(["report", str(path), *terms]) == 0
    text = capsys.readouterr().out
    advice_part = text[text.index("\nadvice"):]
    assert "throughput at least +" in advice_part.splitlines()[2]  # the headline, after a blank line and the title
    assert "  ≥ ≤: a lower bound on the gain" in advice_part
    assert "    at least: rank 2 to the median: rank 2 computes on the cores of host" in advice_part
    assert "straggler ≥" in advice_part
    assert main(["report", str(path), "--json", *terms]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["advise", str(path), "--json", *terms]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert advice == report["advice"]
    [c] = [c for c in advice["fixes"] if c["kind"] == "straggler"]
    assert "rank 2 computes on the cores of host" in c["lower_bound"] and c["epoch"]["at_most"] is True
    others = [x for x in (*advice["fixes"], *advice["buys"]) if x is not c]
    assert others and all(x["lower_bound"] is None and x["epoch"]["at_most"] is False for x in others)
    assert advice["now"]["at_most"] is False
    assert "rank 2 computes" in advice["waste"]["straggler_lower_bound"]
    pipeline, _ = load(str(path))
    metrics = scrape(SnapshotCollector(pipeline.snapshot, TERMS))
    marks = {s.labels["change"]: s.value for s in metrics["dagtop_advice_lower_bound"].samples}
    assert marks == {x["title"]: (1 if x is c else 0) for x in (*advice["fixes"], *advice["buys"])}
