"""dagtop's critical path against HTA's (holistictraceanalysis, not a dependency: it pulls jupyterlab) on one
single-rank GPU trace. HTA's critical path needs GPU kernels (on a CPU-only trace it fails building its kernel
graph), so the trace is tests/test_import.py's hand-built NCCL rank. What must agree and why the rest differs:
docs/interop.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_import import nccl_rank

from dagtop.commands.cli import main

COMM_TOLERANCE = 0.05
"""Communication on the critical path, dagtop against HTA: within 5 %."""


def _hta_breakdown(trace_dir: Path) -> dict[str, float]:
    """HTA's critical path of ProfilerStep 0 of rank 0: µs per ``bound_by``; skips where HTA cannot run."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        pytest.skip("holistictraceanalysis is not installed (pip install holistictraceanalysis 'pandas<3')")
    try:
        graph, ok = TraceAnalysis(trace_dir=str(trace_dir)).critical_path_analysis(
            rank=0, annotation="ProfilerStep", instance_id=0)
        breakdown = graph.get_critical_path_breakdown()
    except Exception as exc:  # noqa: BLE001 - HTA 0.5.0 raises ValueError under pandas 3, TypeError without kernels
        pytest.skip(f"HTA's critical_path_analysis failed here: {type(exc).__name__}: {exc}")
    assert ok
    return {str(k): float(v) for k, v in breakdown.groupby("bound_by")["duration"].sum().items()}


def test_communication_on_the_critical_path_agrees_with_hta(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    trace: dict[str, Any] = nccl_rank(0, 0.0)
    trace["distributedInfo"]["world_size"] = 1
    (tmp_path / "traces").mkdir()
    path = tmp_path / "traces" / "rank-0.json"
    path.write_text(json.dumps(trace))
    hta = _hta_breakdown(tmp_path / "traces")
    assert main(["import", str(path), "-o", str(tmp_path / "run.dagtop")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run.dagtop"), "--json", "--iterations", "0:"]) == 0
    report = json.loads(capsys.readouterr().out)
    dagtop_comm_us = report["critical_path"]["allreduce"] * report["iteration_ms"]["median"] * 1e3
    assert dagtop_comm_us == pytest.approx(hta["gpu_communication_bound"], rel=COMM_TOLERANCE)
    # HTA's path starts at the step's first operator (the loader before it is not in its graph) and ends at the
    # last kernel: never longer than dagtop's iteration, which runs from the step's start to the update's end.
    assert sum(hta.values()) <= report["iteration_ms"]["median"] * 1e3
