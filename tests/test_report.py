"""``dagtop report`` on the committed demo recordings, on broken files, and end to end on a real demo run."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dagtop.commands.cli import main
from dagtop.commands.report import write_text
from dagtop.io.recording import MAGIC, RecordingWriter
from dagtop.model.pipeline import Pipeline
from dagtop.model.summary import summarize
from dagtop.model.synthetic import SyntheticJob, synthetic_frames

FIXTURES = Path(__file__).resolve().parents[1] / "dagtop" / "fixtures"
KEYS = {"ranks", "iterations", "iteration_ms", "critical_path", "bottleneck", "straggler",
        "predicted_iteration_ms", "model_error", "what_if"}


def report_json(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:  # type: ignore[type-arg]
    assert main(["report", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("name", "bottleneck", "straggler"),
    [("io", "io", None), ("compute", "compute", None), ("straggler1-io", "io", (1, "io")),
     ("allreduce", "allreduce", None)],
)
def test_fixture_names_its_bottleneck_and_straggler(
    name: str, bottleneck: str, straggler: tuple[int, str] | None, capsys: pytest.CaptureFixture[str]
) -> None:
    s = report_json(FIXTURES / f"demo-{name}.dagtop", capsys)
    assert KEYS <= s.keys()
    assert s["bottleneck"] == bottleneck
    got = None if s["straggler"] is None else (s["straggler"]["rank"], s["straggler"]["category"])
    assert got == straggler
    assert s["model_error"] <= 0.05
    assert sum(s["critical_path"].values()) == pytest.approx(1.0)
    assert s["first_iteration"] == 1  # warm-up iteration 0 skipped


def test_fixture_what_ifs_are_sane(capsys: pytest.CaptureFixture[str]) -> None:
    s = report_json(FIXTURES / "demo-straggler1-io.dagtop", capsys)
    w = {x["change"]: x for x in s["what_if"]}
    assert w["straggler at median"]["speedup"] > 2.0  # rank 1 waits ~140 ms per batch, the rest ~60 ms
    assert w["all-reduce ×0.5"]["iteration_ms"] <= s["predicted_iteration_ms"] <= w["all-reduce ×2"]["iteration_ms"]
    a = report_json(FIXTURES / "demo-allreduce.dagtop", capsys)
    wa = {x["change"]: x for x in a["what_if"]}
    assert wa["all-reduce ×0.5"]["speedup"] > 1.05 and a["exposed_comm_ms"] > 15


def test_a_network_given_as_a_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    """The α-β fit's bus bandwidth and its spread; the network what-if at twice it, or at the --bandwidth given,
    faster for more bandwidth, with the iteration time it would have within the fit's ±1 s.e."""
    s = report_json(FIXTURES / "demo-allreduce.dagtop", capsys)
    net = s["network"]
    lo, hi = net["bus_gbps_range"]
    assert 0 < lo < net["bus_gbps"] < hi and net["collectives"] > 10
    assert net["sizes"] == 1 and net["alpha_us"] is None  # the demo's two buckets always travel together
    w = {x["change"]: x for x in s["what_if"]}
    twice = w["network bandwidth"]
    assert twice["bandwidth_gbps"] == pytest.approx(2 * net["bus_gbps"], rel=0.05)  # the fit moves over the run
    # Medians over iterations of each bound (each iteration's bounds bracket its prediction: the properties).
    for change in ("network bandwidth", "2N workers"):
        lo, hi = w[change]["iteration_ms_bounds"]
        assert lo <= hi and abs(w[change]["iteration_ms"] - (lo + hi) / 2) < hi - lo + 0.05 * w[change]["iteration_ms"]
    fast = {x["change"]: x for x in report_json(FIXTURES / "demo-allreduce.dagtop", capsys, "--bandwidth", "50")[
        "what_if"]}["network bandwidth"]
    assert fast["bandwidth_gbps"] == 50 and fast["iteration_ms"] < twice["iteration_ms"]
    assert main(["report", str(FIXTURES / "demo-allreduce.dagtop"), "--bandwidth", "50"]) == 0
    text = capsys.readouterr().out
    assert "network 50 GB/s" in text and "latency unknown (taken as 0)" in text
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(FIXTURES / "demo-allreduce.dagtop"), "--bandwidth", "0"])
    assert exit_.value.code == 2 and "must be above 0 GB/s" in capsys.readouterr().err


def test_iteration_range_and_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    s = report_json(FIXTURES / "demo-none.dagtop", capsys, "--iterations", "0:5")
    assert (s["first_iteration"], s["last_iteration"], s["iterations"]) == (0, 4, 5)
    assert main(["report", str(FIXTURES / "demo-io.dagtop")]) == 0
    text = capsys.readouterr().out
    assert "bottleneck       io" in text and "what if" in text


@pytest.mark.parametrize("content", [None, b"not a recording", MAGIC])
def test_unreadable_files_exit_2_with_a_message(
    tmp_path: Path, content: bytes | None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.dagtop"
    if content is not None:
        path.write_bytes(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dagtop report: ") and "Traceback" not in err


def test_cut_tail_warns_and_reports_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cut.dagtop"
    with RecordingWriter(path) as w:
        for f in synthetic_frames(SyntheticJob(ranks=2), iterations=4):
            w.append(f)
    path.write_bytes(path.read_bytes()[:-7])
    assert main(["report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "cut-short" in captured.err
    assert json.loads(captured.out)["iterations"] >= 2


def test_summarize_names_the_synthetic_straggler() -> None:
    p = Pipeline(window=None)
    p.feed(synthetic_frames(SyntheticJob(ranks=4, slow_ranks=(2,), slow_category="compute"), iterations=6))
    assert summarize(p.analyses()[1:])["straggler"] is None  # five iterations are no evidence, however clear
    p = Pipeline(window=None)
    p.feed(synthetic_frames(SyntheticJob(ranks=4, slow_ranks=(2,), slow_category="compute"), iterations=21))
    short = summarize(p.analyses()[1:])
    assert short["straggler"] is None  # 20 iterations of 50 ms: a second is no straggler yet, and the report says so
    assert short["lasted_s"] == pytest.approx(sum(a.measured_ms for a in p.analyses()[1:]) / 1000)
    assert short["lasted_s"] < 2
    out = io.StringIO()
    write_text(short, out)
    assert f"straggler        none named: the iterations analysed last {short['lasted_s']:.1f} s, and a rank is named " \
           "from 2 s of them at least (or 150 iterations)\n" in out.getvalue()
    p = Pipeline(window=None)
    p.feed(synthetic_frames(SyntheticJob(ranks=4, slow_ranks=(2,), slow_category="compute"), iterations=61))
    s = summarize(p.analyses()[1:])
    assert s["straggler"]["rank"] == 2 and s["straggler"]["category"] == "compute"
    assert s["straggler"]["above"] == s["straggler"]["iterations"] == 60
    assert s["model_error"] <= 0.01


DEMO_ITERATIONS = 40
"""A straggler is named from 2 s of iterations at least: the demo's compute straggler steps ~125 ms here, so 40 of
them last twice that on a machine twice as fast."""
DEMO_MIN_SHARE = 0.2
"""The share of the critical path that a demo's slowed category holds at least: 0.5 to 0.6 on an idle 2-core
machine, 0.4 with a busy loop on each core, against under 0.05 for a category the demo does not slow."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "category", "straggler"),
    [(["--bottleneck", "io"], "io", None), (["--straggler", "1", "--bottleneck", "io"], "io", 1),
     (["--straggler", "1", "--bottleneck", "compute"], "compute", 1),
     (["--bottleneck", "allreduce"], "allreduce", None)],
)
def test_real_demo_end_to_end(tmp_path: Path, args: list[str], category: str, straggler: int | None) -> None:
    """Only what holds by a wide margin on any machine: the slowed category's large share, and a straggler that
    does several times its peer's work. Whether io or all-reduce *outweighs* compute depends on how busy the CPUs
    are (compute swells on a loaded machine, a sleep does not): benchmarks/demo_verdicts.py checks that. Nor is
    "no straggler" asserted where none was made: on a shared 2-core machine one rank can really be starved of CPU
    for most iterations, and then naming it is right (test_critical_path.py and test_verdict.py hold the balanced
    case exactly)."""
    rec = tmp_path / "demo.dagtop"
    run = subprocess.run([sys.executable, "-m", "dagtop", "demo", "--record", str(rec),
                          "--iterations", str(DEMO_ITERATIONS),
                          *args], capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "dagtop", "report", str(rec), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["critical_path"][category] >= DEMO_MIN_SHARE, s["critical_path"]
    if straggler is not None:
        assert (s["straggler"] or {}).get("rank") == straggler, s["straggler"]
        assert s["straggler"]["category"] == category, s["straggler"]
    assert s["model_error"] <= 0.05


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`dagtop report FILE | head`: the pipe closes under the report; that is not a crash."""
    for unbuffered in ("1", ""):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        report = subprocess.Popen([sys.executable, "-m", "dagtop", "report", str(FIXTURES / "demo-io.dagtop")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert report.stdout is not None and report.stderr is not None
        report.stdout.close()  # the reader is gone before the first line is written
        assert report.wait(timeout=120) == 141
        assert report.stderr.read() == b""
