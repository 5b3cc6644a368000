"""Prometheus metrics: the families a scrape returns for a known recording, a scrape of ``dagtop record
--metrics-port`` while a real 2-rank job is being recorded, and a port that cannot be bound."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.waits import JOB_WAIT_S
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ranks import run_job

from dagtop.commands.cli import main
from dagtop.demo.launch import free_endpoint, free_port
from dagtop.exits import Exit
from dagtop.interop.metrics import MetricsServer
from dagtop.io.recording import read_recording
from dagtop.model.liveness_view import LivenessView
from dagtop.model.pipeline import Pipeline

FIXTURES = Path(__file__).parent.parent / "dagtop" / "fixtures"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) → value, from the exposition format."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_recording_s_metrics(tmp_path: Path) -> None:
    pipeline = Pipeline(window=None)
    pipeline.feed(read_recording(FIXTURES / "demo-straggler1-io.dagtop"))
    server = MetricsServer(pipeline.snapshot, ("127.0.0.1", 0))
    try:
        got = samples(generate_latest(server.registry).decode())
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:  # served, too
            assert samples(r.read().decode()).keys() == got.keys()
    finally:
        server.close()
    latest = [a for a in pipeline.analyses() if a.complete][-1]
    assert got[("dagtop_iteration_seconds", ())] == pytest.approx(latest.measured_ms / 1e3)
    shares = {labels[0][1]: v for (name, labels), v in got.items() if name == "dagtop_critical_path_share"}
    assert set(shares) == {"compute", "io", "pcie", "allreduce", "other"} and sum(shares.values()) == pytest.approx(1)
    assert max(shares, key=shares.__getitem__) == "io"
    assert got[("dagtop_straggler_rank", ())] == 1
    excess = [(labels, v) for (name, labels), v in got.items() if name == "dagtop_straggler_excess_seconds"]
    assert len(excess) == 1 and excess[0][0] == (("category", "io"), ("rank", "1")) and excess[0][1] > 0.05
    assert ("dagtop_exposed_communication_seconds", ()) in got
    assert got[("dagtop_dropped_frames_total", ())] == 0 and got[("dagtop_rejected_frames_total", ())] == 0
    rates = {labels: v for (name, labels), v in got.items() if name == "dagtop_rank_iterations_per_second"}
    assert set(rates) == {(("rank", "0"),), (("rank", "1"),)} and all(v > 0 for v in rates.values())


@pytest.mark.slow
def test_scraped_while_recording_a_live_job(tmp_path: Path) -> None:
    endpoint, port = free_endpoint(), free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "dagtop", "record", "--bind", endpoint, "-o", str(tmp_path / "run.dagtop"),
         "--metrics-port", f"127.0.0.1:{port}", "--timeout", str(JOB_WAIT_S)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    scrapes: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set() and recorder.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    scrapes.append(samples(r.read().decode()))
            except OSError:
                pass  # not serving yet, or the recorder has just stopped
            time.sleep(0.05)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        run = run_job("profiled.py", "--steps", "10", "--traces", str(tmp_path), "--slow", "1", endpoint=endpoint)
        assert run.ok, run.log[-3000:]
        recorder.wait(JOB_WAIT_S)  # every rank said bye: the recording ends
    finally:
        done.set()
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        scraper.join(30)
    assert recorder.returncode == Exit.OK, recorder.stderr.read().decode() if recorder.stderr else ""
    during = [s for s in scrapes if ("dagtop_iteration_seconds", ()) in s]
    assert during, f"no scrape saw an analysed iteration ({len(scrapes)} scrapes)"
    last = during[-1]
    assert last[("dagtop_ranks_expected", ())] == 2 and last[("dagtop_iteration_seconds", ())] > 0
    assert last[("dagtop_straggler_rank", ())] in (-1, 1)  # the steady verdict needs 5 iterations to name it


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        capsys.readouterr()
        code = main(["record", "--bind", free_endpoint(), "-o", str(tmp_path / "r.dagtop"),
                     "--metrics-port", f"127.0.0.1:{port}", "--timeout", "1"])
    err = capsys.readouterr().err
    assert code == Exit.CANNOT_BIND and err.count("\n") == 1 and f"127.0.0.1:{port}" in err


def test_a_bad_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--metrics-port", "70000"])
    assert exit_.value.code == Exit.USAGE and "not a port" in capsys.readouterr().err


def test_once_the_job_ended_the_rates_are_zero_and_it_says_so() -> None:
    """Issue #30: the last rate measured stayed on the endpoint forever after the job ended."""
    pipeline = Pipeline(window=None)
    pipeline.feed(read_recording(FIXTURES / "demo-straggler1-io.dagtop"))
    running = pipeline.snapshot()
    assert running.running and running.iterations_per_s > 0
    ended = dataclasses.replace(running, ranks=tuple(dataclasses.replace(r, connected=False) for r in running.ranks))
    stalled = dataclasses.replace(running, liveness=LivenessView(stalled_s=14.2))
    for snap, job_running in ((running, 1), (ended, 0), (dataclasses.replace(running, finished=True), 0),
                              (stalled, 1)):
        server = MetricsServer(lambda snap=snap: snap, ("127.0.0.1", 0))  # type: ignore[misc]
        try:
            got = samples(generate_latest(server.registry).decode())
        finally:
            server.close()
        assert got[("dagtop_job_running", ())] == job_running
        rates = [v for (name, _), v in got.items() if name == "dagtop_rank_iterations_per_second"]
        if snap is running:
            assert got[("dagtop_iterations_per_second", ())] == pytest.approx(snap.iterations_per_s)
            assert rates and all(v > 0 for v in rates)
        else:  # stalled or ended: 0; the figures of the last iterations stay, they describe how it ended
            assert got[("dagtop_iterations_per_second", ())] == 0 and rates and all(v == 0 for v in rates)
            assert got[("dagtop_iteration_seconds", ())] > 0
