"""``dagtop export``: a recording as Chrome trace-event JSON, checked against the trace-event format (the JSON
object form, complete ``X`` slices that nest on every track, ``M`` metadata, ``s``/``f`` flow pairs bound to slices)
and, where its trace processor can run here, loaded by Perfetto."""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dagtop.commands.cli import main
from dagtop.exits import Exit

FIXTURES = Path(__file__).parent.parent / "dagtop" / "fixtures"
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace_events(trace: Any) -> None:
    """Fail on anything in ``trace`` that the trace-event format (JSON object form) does not allow or that a
    viewer would mis-draw: slices overlapping without nesting on one track, a flow without both ends."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in trace["traceEvents"]:
        assert isinstance(e.get("name"), str) and isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and e["dur"] >= 0, e
            assert isinstance(e.get("args", {}), dict) and isinstance(e.get("cat", ""), str)
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e["args"], dict), e
        elif e["ph"] in ("s", "f"):
            assert e["id"] not in flows or e["ph"] not in flows[e["id"]], f"flow {e['id']}: two {e['ph']} events"
            assert e["ph"] == "s" or e.get("bp") == "e", e
            flows[e["id"]][e["ph"]] = e
        else:
            raise AssertionError(f"unexpected phase {e['ph']!r}")
    for track, spans in slices.items():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-3:  # ts and dur are rounded to the ns apart
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, f"slices cross without nesting on {track} at {start}"
            stack.append(end)
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid} has only {set(pair)}"
        for end in pair.values():  # each end lies inside a slice of its track (what it binds to)
            spans = slices[(end["pid"], end["tid"])]
            assert any(a - 1e-3 <= end["ts"] <= b + 1e-3 for a, b in spans), f"flow {fid} end outside a slice"


@pytest.fixture
def exported(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "run.trace.json"
    assert main(["export", str(FIXTURES / "demo-straggler1-io.dagtop"), "-o", str(out)]) == Exit.OK
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_the_export_is_valid_trace_event_json(exported: dict[str, Any]) -> None:
    check_trace_events(exported)


def test_a_process_per_rank_a_track_per_lane_and_the_critical_path(exported: dict[str, Any]) -> None:
    events = exported["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == ["critical path", "rank 0", "rank 1"]
    threads = {(processes[e["pid"]], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {("rank 0", "main"), ("rank 1", "main"), ("rank 0", "comm"), ("rank 1", "comm"),
            ("critical path", "critical path")} <= threads
    path_pid = next(p for p, n in processes.items() if n == "critical path")
    iterations = [e for e in events if e["pid"] == path_pid and e.get("cat") == "iteration"]
    assert iterations and all(e["args"]["what_if"] for e in iterations)
    # The job's straggler is rank 1 loading slowly: the iterations and the summary say so.
    stragglers = [e["args"]["straggler"] for e in iterations if e["args"]["straggler"]]
    assert stragglers and all(s == {**s, "rank": 1, "category": "io"} for s in stragglers)
    summary = exported["metadata"]["dagtop"]
    assert summary["straggler"]["rank"] == 1 and {w["change"] for w in summary["what_if"]} >= {"I/O hidden"}


def test_collectives_are_linked_across_ranks_from_the_rank_they_waited_for(exported: dict[str, Any]) -> None:
    events = exported["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()
    assert all(starts[i]["pid"] != ends[i]["pid"] for i in starts)  # each arrow joins two ranks
    # From rank 1 (process 2), the straggler, in every iteration but the first (its loader was not slow yet).
    assert sum(s["pid"] == 2 for s in starts.values()) >= len(starts) - 1


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["export", str(tmp_path / "none.dagtop"), "-o", str(tmp_path / "o.json")]) == Exit.BAD_INPUT
    assert capsys.readouterr().err.count("\n") == 1
    (tmp_path / "junk.dagtop").write_bytes(b"not a recording")
    assert main(["export", str(tmp_path / "junk.dagtop"), "-o", str(tmp_path / "o.json")]) == Exit.BAD_INPUT
    assert "not a dagtop recording" in capsys.readouterr().err


def _trace_processor_shell() -> str | None:
    """A trace_processor_shell already on this machine: perfetto's Python package otherwise downloads one, which
    cannot work offline (CI here has no network)."""
    found = os.environ.get("PERFETTO_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
    if found:
        return found
    prebuilt = sorted((Path.home() / ".local/share/perfetto/prebuilts").glob("trace_processor_shell*"))
    return str(prebuilt[-1]) if prebuilt and not prebuilt[-1].name.endswith(".tmp") else None


def test_perfetto_loads_the_export(tmp_path: Path) -> None:
    tp_module = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package is not installed")
    shell = _trace_processor_shell()
    if shell is None:
        pytest.skip("perfetto's trace_processor_shell is not on this machine and cannot be downloaded offline; "
                    "the format is checked by test_the_export_is_valid_trace_event_json")
    out = tmp_path / "run.trace.json"
    assert main(["export", str(FIXTURES / "demo-straggler1-io.dagtop"), "-o", str(out)]) == Exit.OK
    config = tp_module.TraceProcessorConfig(bin_path=shell)
    with tp_module.TraceProcessor(trace=str(out), config=config) as tp:
        names = {r.name for r in tp.query("select distinct name from process")}
        assert {"rank 0", "rank 1", "critical path"} <= names
        assert next(iter(tp.query("select count(*) as n from flow"))).n > 0
