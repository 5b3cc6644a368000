"""``dagtop import``: PyTorch-profiler traces of real 2-rank gloo jobs (plain and gzipped, cut short), read by
``report``, ``replay`` and ``export`` like a live recording, and naming the same straggler as dagtop's own live
recording of the same iterations; an NCCL-style trace built by hand for what a CPU job cannot produce
(``record_param_comms``, ``ncclDevKernel_*``, GPU kernels)."""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Collector
from ranks import run_job
from test_agreement import screen_names

from dagtop.commands.cli import main
from dagtop.demo.launch import free_endpoint
from dagtop.exits import Exit
from dagtop.interop.importer import import_traces
from dagtop.io.folded import load
from dagtop.io.recording import RecordingWriter, read_recording
from dagtop.io.sources import RecordingSource
from dagtop.model.pipeline import Pipeline
from dagtop.model.straggler import LONGEST
from instrument import wire

STEPS = 80
"""Profiled steps of the slow-loader job: enough for the straggler test to name a rank above the other in every one
(14 of 14 at the least, with two ranks) over a window that lasts 2 s (its steps wait ~50 ms for the slow batch)."""
COMPUTE_STEPS = LONGEST + 10
"""The slow-compute job's steps: 20–40 ms each on a 2-core machine, shorter on a faster one, so it runs enough of them
to be judged however fast it is (a window of :data:`~dagtop.model.straggler.LONGEST` iterations), not 2 s of them."""


def _report(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == Exit.OK
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _profiled(tmp: Path, *args: str, steps: int = STEPS) -> tuple[Path, Path]:
    """Run tests/jobs/profiled.py on 2 ranks, timed by dagtop and profiled at once: (live recording, trace dir)."""
    traces = tmp / "traces"
    traces.mkdir()
    endpoint = free_endpoint()
    collector = Collector(endpoint)
    try:
        run = run_job("profiled.py", "--steps", str(steps), "--traces", str(traces), *args, endpoint=endpoint)
        assert run.ok, run.log[-3000:]
        frames = collector.until_bye(2)
    finally:
        collector.stop()
    live = tmp / "live.dagtop"
    with RecordingWriter(live) as writer:
        for raw in frames:
            writer.append(raw)
    return live, traces


@pytest.fixture(scope="module")
def io_job() -> Iterator[tuple[Path, Path]]:
    """Rank 1's dataset is slow; gzipped traces, shapes recorded, no Python stack (operator groups)."""
    tmp = Path(tempfile.mkdtemp(prefix="dagtop-import-"))
    try:
        yield _profiled(tmp, "--slow", "1", "--slow-in", "io", "--gzip")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def compute_job() -> Iterator[tuple[Path, Path]]:
    """Rank 1 computes its middle block many times over; Python stack on, so the trace has nn.Module annotations."""
    tmp = Path(tempfile.mkdtemp(prefix="dagtop-import-"))
    try:
        yield _profiled(tmp, "--slow", "1", "--slow-in", "compute", "--stack", steps=COMPUTE_STEPS)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_gzip_traces_name_the_live_straggler(io_job: tuple[Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    live, traces = io_job
    out = tmp_path / "run.dagtop"
    assert main(["import", str(traces / "trace-0.json.gz"), str(traces / "trace-1.json.gz"), "-o", str(out)]) == 0
    imported, measured = _report(out, capsys), _report(live, capsys)
    assert measured["straggler"] is not None and measured["straggler"]["rank"] == 1
    assert imported["straggler"]["rank"] == measured["straggler"]["rank"] == 1
    assert imported["straggler"]["category"] == measured["straggler"]["category"] == "io"
    # The screen replaying the imported trace names it too: headline, ranks table and rank picker.
    assert screen_names(out) == {"headline": {1}, "table": {1}, "picker": {1}}
    assert imported["bottleneck"] == measured["bottleneck"] == "io"
    assert imported["ranks"] == 2 and imported["iterations"] == STEPS  # ProfilerStep#1..16: 0 was the warm-up
    # Two DDP buckets per iteration, named alike on both ranks, with the bucket sizes from the recorded shapes.
    names = {c["name"]: c["bytes"] for c in imported["collectives"]}
    live_sizes = sorted(c["bytes"] for c in measured["collectives"])
    assert {"allreduce #0", "allreduce #1"} <= set(names)
    assert sorted(names[n] for n in ("allreduce #0", "allreduce #1")) == live_sizes


@pytest.mark.slow
def test_plain_json_is_the_same_recording(io_job: tuple[Path, Path], tmp_path: Path) -> None:
    _, traces = io_job
    plain = []
    for rank in (0, 1):
        path = tmp_path / f"trace-{rank}.json"
        path.write_bytes(gzip.decompress((traces / f"trace-{rank}.json.gz").read_bytes()))
        plain.append(str(path))
    from_gzip = import_traces([str(traces / f"trace-{r}.json.gz") for r in (1, 0)])  # order: distributedInfo
    from_json = import_traces(plain)
    def frames(result: Any) -> list[Any]:  # the hello names its file: the rest is byte for byte the same
        return [f if not isinstance(f, wire.Hello) else f.model for f in map(wire.decode,
                                                                          (r.payload for r in result.frames))]

    assert [m.replace(".gz", "") if isinstance(m, str) else m for m in frames(from_gzip)] == frames(from_json)


@pytest.mark.slow
def test_replay_and_export_read_an_imported_recording(io_job: tuple[Path, Path], tmp_path: Path) -> None:
    _, traces = io_job
    out = tmp_path / "run.dagtop"
    assert main(["import", *(str(p) for p in sorted(traces.glob("*.gz"))), "-o", str(out)]) == 0
    source, pipeline = RecordingSource(out, speed=0), Pipeline(window=None)
    while not source.finished:
        pipeline.feed(source.poll(0.01))
    pipeline.finish()
    assert [a.iteration for a in pipeline.analyses() if a.complete] == list(range(1, STEPS + 1))
    assert pipeline.rejected == 0
    exported = tmp_path / "run.trace.json"
    assert main(["export", str(out), "-o", str(exported)]) == 0
    names = {e["args"]["name"] for e in json.loads(exported.read_text())["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1", "critical path"}


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["json", "gzip"])
def test_a_cut_short_trace_is_one_line_and_bad_input(io_job: tuple[Path, Path], tmp_path: Path, cut: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _, traces = io_job
    data = (traces / "trace-0.json.gz").read_bytes()
    if cut == "json":
        data = gzip.decompress(data)
    short = tmp_path / f"short.json{'.gz' if cut == 'gzip' else ''}"
    short.write_bytes(data[: len(data) // 2])
    out = tmp_path / "run.dagtop"
    capsys.readouterr()
    assert main(["import", str(short), str(traces / "trace-1.json.gz"), "-o", str(out)]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cut short" in err and str(short) in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_module_annotations_give_per_module_tasks_and_the_compute_straggler(
        compute_job: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live, traces = compute_job
    out = tmp_path / "run.dagtop"
    assert main(["import", *(str(p) for p in sorted(traces.glob("trace-*.json"))), "-o", str(out)]) == 0
    frames = [wire.decode(r.payload) for r in read_recording(out)]
    hello = next(f for f in frames if isinstance(f, wire.Hello))
    assert hello.units == "3 modules: Block_0, Block_1, Linear_2"  # Net's children, under DDP and Net
    batch = next(f for f in frames if isinstance(f, wire.IterationBatch) and f.iteration == 2)
    phases = [(e.phase, e.name) for e in sorted(batch.events, key=lambda e: e.start_ns) if e.lane == "main"]
    assert phases == [("load", "next"), ("forward", "Block_0"), ("forward", "Block_1"), ("forward", "Linear_2"),
                      ("backward", "Linear_2"), ("backward", "Block_1"), ("backward", "Block_0"),
                      ("update", "optimizer.step")]
    imported, measured = _report(out, capsys), _report(live, capsys)
    both = (imported["straggler"], measured["straggler"])
    assert both[0] and both[1], both
    assert (both[0]["rank"], both[0]["category"]) == (both[1]["rank"], both[1]["category"]), both
    # Rank 1 and compute, as the job was made, unless the machine was so loaded that the other rank was held up
    # more (seen with two test runs at once on 2 cores: both instruments then named rank 0, host time); the
    # io job's 50 ms per step is checked for the ground truth whatever the load.
    if both[1]["busy_excess_ms"] > 5:
        assert (both[0]["rank"], both[0]["category"]) == (1, "compute"), both


# ------------------------------------------------------------------ hand-built traces


def _x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def nccl_rank(rank: int, late_us: float) -> dict[str, Any]:
    """One step on a GPU rank: forward kernels, backward kernels, an all-reduce (NCCL) on process group 0 with
    sequence number 7 that ends at 3.5 ms everywhere, the update. ``late_us`` (up to 2 ms) lengthens the forward kernel:
    the rank is slow in compute."""
    d = late_us
    events = [
        _x("ProfilerStep#3", 0, 4000, cat="user_annotation"),
        _x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 10, 90, cat="user_annotation"),
        _x("aten::linear", 100, 50, **{"Sequence number": 5, "Fwd thread id": 0}),
        _x("cudaLaunchKernel", 110, 5, cat="cuda_runtime", correlation=rank * 100 + 1),
        _x("autograd::engine::evaluate_function: AddmmBackward0", 200, 50, tid=2,
           **{"Sequence number": 5, "Fwd thread id": 1}),
        _x("cudaLaunchKernel", 210, 5, tid=2, cat="cuda_runtime", correlation=rank * 100 + 2),
        _x("record_param_comms", 300, 20, tid=2, **{"Collective name": "allreduce", "In msg nelems": 1000,
                                                    "dtype": "Float", "Process Group Name": "0", "Seq": 7}),
        _x("cudaLaunchKernel", 305, 5, tid=2, cat="cuda_runtime", correlation=rank * 100 + 3),
        _x("Optimizer.step#AdamW.step", 3600, 100, cat="user_annotation"),
        _x("cudaLaunchKernel", 3610, 5, cat="cuda_runtime", correlation=rank * 100 + 4),
        _x("sm90_gemm_fwd", 120, 300 + d, tid=7, cat="kernel", correlation=rank * 100 + 1, stream=7),
        _x("sm90_gemm_bwd", 430 + d, 400, tid=7, cat="kernel", correlation=rank * 100 + 2, stream=7),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 840 + d, 2660 - d, tid=20, cat="kernel",
           correlation=rank * 100 + 3, stream=20),
        _x("multi_tensor_apply_kernel", 3620, 60, tid=7, cat="kernel", correlation=rank * 100 + 4, stream=7),
    ]
    for e in events:
        if e["cat"] == "kernel":
            e["pid"] = 0
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "host_name": "gpu-node", "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}


def _write(tmp_path: Path, name: str, trace: Any, gz: bool = False) -> str:
    path = tmp_path / name
    data = (trace if isinstance(trace, str) else json.dumps(trace)).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


def test_nccl_collectives_take_the_kernels_span_and_match_by_group_and_sequence(tmp_path: Path) -> None:
    paths = [_write(tmp_path, "b.json.gz", nccl_rank(1, 2000.0), gz=True), _write(tmp_path, "a.json", nccl_rank(0, 0))]
    result = import_traces(paths)
    assert (result.ranks, result.world, result.iterations, result.collectives) == (2, 2, 1, 1)
    batches = {f.rank: f for f in map(wire.decode, (r.payload for r in result.frames))
               if isinstance(f, wire.IterationBatch)}
    assert set(batches) == {0, 1} and batches[1].iteration == 3
    for rank, late in ((0, 0), (1, 2000)):
        ev = {(e.phase, e.name): e for e in batches[rank].events}
        comm = ev[("allreduce", "allreduce #0")]
        assert (comm.lane, comm.start_ns, comm.end_ns, comm.bytes) == ("comm", (840 + late) * 1000, 3_500_000, 4000)
        fwd = ev[("forward", "aten::linear")]  # no nn.Module annotations: an operator group, timed on the GPU
        assert (fwd.lane, fwd.start_ns, fwd.end_ns) == ("gpu", 120_000, (420 + late) * 1000)
        bwd = ev[("backward", "aten::linear")]  # the backward thread's function, tied by its sequence number
        assert (bwd.lane, bwd.start_ns, bwd.end_ns) == ("gpu", (430 + late) * 1000, (830 + late) * 1000)
        assert ev[("update", "optimizer.step")].lane == "gpu"
        assert ev[("load", "next")].lane == "main"


def test_the_slow_gpu_rank_is_the_straggler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.dagtop"
    paths = [_write(tmp_path, f"r{r}.json", nccl_rank(r, 2000.0 * r)) for r in (0, 1)]
    assert main(["import", *paths, "-o", str(out)]) == 0
    # One step is no evidence for the job's straggler (the report names none); the step's own critical path
    # waits for rank 1 at the all-reduce, 2 ms late in compute.
    assert _report(out, capsys)["straggler"] is None
    pipeline, _ = load(str(out))
    [step] = pipeline.analyses()
    assert step.straggler is not None and (step.straggler.rank, step.straggler.category) == (1, "compute")
    assert step.straggler.excess_ms == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize(("content", "message"), [
    ("not json at all", "not JSON"),
    ('{"traceEvents": []}', "no trace events"),
    (json.dumps({"traceEvents": [_x("aten::mm", 0, 5)]}), "no ProfilerStep#N"),
])
def test_bad_traces_are_one_line_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               content: str, message: str) -> None:
    capsys.readouterr()
    assert main(["import", _write(tmp_path, "t.json", content), "-o", str(tmp_path / "o.dagtop")]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("dagtop import: ") and message in err and err.count("\n") == 1


def test_two_traces_of_one_rank_and_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = (_write(tmp_path, f"{n}.json", nccl_rank(0, 0)) for n in "ab")
    capsys.readouterr()
    assert main(["import", a, b, "-o", str(tmp_path / "o.dagtop")]) == Exit.BAD_INPUT
    assert "both rank 0" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "nope.json"), "-o", str(tmp_path / "o.dagtop")]) == Exit.BAD_INPUT
    assert "no such file" in capsys.readouterr().err


def test_a_missing_rank_is_a_note_and_its_iterations_incomplete(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.dagtop"
    capsys.readouterr()
    assert main(["import", _write(tmp_path, "r1.json", nccl_rank(1, 0)), "-o", str(out)]) == 0
    assert "no trace of rank 0 of 2" in capsys.readouterr().err
