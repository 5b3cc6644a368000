"""The advice where people read it: ``dagtop advise``, the report's section and JSON, Prometheus; and the frames that
carry what it needs (the buckets' parameter sizes, the DataLoader's settings)."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from helpers.frames import hello
from prometheus_client.core import Metric

from dagtop.commands.cli import main
from dagtop.interop.metrics import SnapshotCollector
from dagtop.io.folded import load
from dagtop.model.cost import CostTerms
from instrument import wire
from instrument.loader import describe_loader
from instrument.wire_fields import Bucket, Loader

FIXTURES = Path(__file__).resolve().parents[1] / "dagtop" / "fixtures"
ADVICE = FIXTURES / "demo-advice.dagtop"
"""The demo's io job (no DataLoader workers), recorded by a shim that sends the loader's settings and the
buckets' parameter sizes."""


def test_advise_prints_the_best_change_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(ADVICE), "--gpu-hour-price", "2.5", "--epoch-samples", "1281167"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("best change: num_workers=") and "(input pipeline): throughput +" in first
    assert "fix vs buy, per epoch (10010 steps: --epoch-samples 1281167 at 64 per rank × 2 ranks" in out
    assert "$2.5 per GPU-hour" in out and "waste so far (29 iterations" in out
    assert "DataLoader(..., num_workers=" in out  # the change to make, written out


def test_advise_json_is_the_reports_advice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(ADVICE), "--json", "--gpu-hour-price", "2"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert main(["report", str(ADVICE), "--json", "--gpu-hour-price", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["advice"] == advice
    best = advice["fixes"][0]
    assert advice["best"] == best["title"] and best["kind"] == "input pipeline"
    assert best["setting"]["num_workers"] >= 1 and best["throughput"] > 1.02
    lo, hi = best["step_ms_range"]
    assert lo <= best["step_ms"] <= hi and best["step_ms"] < advice["step_ms"]
    # The epoch from the DataLoader's own length, priced: the fix costs less than now by its throughput.
    assert advice["epoch"]["source"].startswith("the DataLoader's length")
    assert best["epoch"]["dollars"] == pytest.approx(advice["now"]["dollars"] / best["throughput"])
    assert set(advice["waste"]) == {"iterations", "gpu_hours", "communication", "loading", "straggler",
                                    "straggler_lower_bound"}
    # A loader that waits is no lower bound (tests/test_advice_lower_bound.py has one that is).
    assert best["lower_bound"] is None and best["epoch"]["at_most"] is False
    assert advice["waste"]["straggler_lower_bound"] is None


def test_the_straggler_advised_is_the_reports_with_its_what_if(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's rank 1 reads slowly: the advice names the report's straggler, by the same rule over the same
    iterations (the recording is shorter than the advice's window), and predicts the report's 'straggler at median'."""
    assert main(["report", str(FIXTURES / "demo-straggler1-io.dagtop"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    at_median = next(w for w in report["what_if"] if w["change"] == "straggler at median")
    advised = next(c for c in report["advice"]["fixes"] if c["kind"] == "straggler")
    assert report["straggler"]["rank"] == 1 and advised["setting"] == {"rank": 1}
    assert advised["speedup"] == pytest.approx(at_median["speedup"]) and advised["speedup"] > 1.5
    assert report["advice"]["best"] == advised["title"] and "in io: it waits longer for its data" in advised["evidence"]


def test_the_report_ends_with_the_advice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(ADVICE)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("\nadvice (dagtop advise prints it in full)\n"):]
    assert section.splitlines()[2].startswith("best change: num_workers=")


def test_advise_on_what_is_not_a_recording_says_so_in_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(tmp_path / "missing.dagtop")]) == 2
    assert capsys.readouterr().err.strip() == f"dagtop advise: {tmp_path / 'missing.dagtop'}: no such file"
    junk = tmp_path / "junk.dagtop"
    junk.write_bytes(b"not a recording")
    assert main(["advise", str(junk)]) == 2
    assert capsys.readouterr().err.startswith("dagtop advise: ")
    assert main(["advise", str(ADVICE), "--iterations", "500:"]) == 2
    assert "no analysed iteration in the range" in capsys.readouterr().err


def test_an_older_recording_gets_advice_without_the_bucket_change(capsys: pytest.CaptureFixture[str]) -> None:
    """demo-io predates the parameter sizes: the buckets are not predicted, and it says why."""
    assert main(["advise", str(FIXTURES / "demo-io.dagtop"), "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert not advice["held"]
    withheld = {w["kind"]: w["why"] for w in advice["withheld"]}
    assert "older than this monitor" in withheld["gradient buckets"]
    assert "tracer.loader()" in withheld["input pipeline"]  # no loader settings either


def scrape(collector: SnapshotCollector) -> dict[str, Metric]:
    return {m.name: m for m in collector.collect()}


def test_prometheus_has_each_advised_change_and_the_epochs_cost() -> None:
    pipeline, _ = load(str(ADVICE))
    metrics = scrape(SnapshotCollector(pipeline.snapshot, CostTerms(gpu_hour_price=3.0, epoch_samples=1_281_167)))
    assert metrics["dagtop_advice_held"].samples[0].value == 0
    gains = {s.labels["change"]: s.value for s in metrics["dagtop_advice_throughput_ratio"].samples}
    best = metrics["dagtop_advice_best"].samples
    assert len(best) == 1 and best[0].labels["kind"] == "input pipeline" and gains[best[0].labels["change"]] > 1.02
    costs = {s.labels["change"]: s.value for s in metrics["dagtop_epoch_cost_dollars"].samples}
    assert costs[best[0].labels["change"]] == pytest.approx(costs["now"] / gains[best[0].labels["change"]])
    assert {s.labels["cause"] for s in metrics["dagtop_waste_gpu_hours"].samples} == {"communication", "loading",
                                                                                      "straggler"}


def test_parameter_sizes_travel_with_the_bucket_map_and_are_checked() -> None:
    buckets = (Bucket(0, 12, ("a", "b")), Bucket(1, 4, ("c",)))
    frame = wire.Buckets(3, 1, buckets, parameter_bytes=((8, 4), (4,)))
    assert wire.decode(wire.encode(frame)) == frame
    older = wire.Buckets(3, 1, buckets)
    assert "param_bytes" not in msgpack.unpackb(wire.encode(older))  # left off: the frame older monitors knew
    assert wire.decode(wire.encode(older)).parameter_bytes == ()
    for bad in (((8, 4),), ((8, 3), (4,)), ((8,), (4,))):  # a bucket missing, not adding up, a name without size
        with pytest.raises(wire.WireError, match="param_bytes"):
            wire.decode(wire.encode(wire.Buckets(3, 1, buckets, parameter_bytes=bad)))


def test_a_hello_carries_the_dataloaders_settings_once_known() -> None:
    torch = pytest.importorskip("torch")
    data = torch.utils.data.TensorDataset(torch.zeros(100, 2))
    loader = describe_loader(torch.utils.data.DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True))
    assert loader == Loader(workers=2, batch_size=8, batches=13, prefetch_factor=2, pin_memory=0,
                                 persistent_workers=1)
    said = hello(0, 2, loader=loader)
    assert wire.decode(wire.encode(said)) == said
    assert "loader" not in msgpack.unpackb(wire.encode(hello(0, 2)))
    assert describe_loader([1, 2, 3]) is None  # not a DataLoader: nothing said
