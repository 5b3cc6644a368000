"""Telemetry: the job's own (sampled in each rank, sent in band, recorded, replayed, drawn per host) and the
monitor's machine (psutil and NVML) that stands in while a job sends none."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgpack
import pynvml
import pytest
from helpers.frames import ListSource

from dagtop.commands.cli import main
from dagtop.commands.record import record
from dagtop.io.recording import RecordingWriter
from dagtop.io.sources import RecordingSource
from dagtop.io.telemetry import (
    HostSample,
    TelemetrySample,
    TelemetrySampler,
    job_nodes,
    rank_label,
)
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.app import make_app
from dagtop.ui.renderables.telemetry import nodes_text, panel_text, panel_title
from dagtop.ui.widgets.telemetry import Telemetry
from instrument import wire
from instrument.wire_fields import GpuStats, HostStats


def test_without_nvml_the_sampler_says_why_and_still_samples_the_host() -> None:
    fake = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(pynvml.NVMLError_LibraryNotFound()))
    sampler = TelemetrySampler(nvml=fake)  # type: ignore[arg-type]
    sample = sampler()
    assert sample.gpus == () and sample.gpu_status == "no NVIDIA GPU (NVML library not found)"
    assert sample.host is not None and 0.0 <= sample.host.cpu_percent <= 100.0 * sample.host.cpus
    assert 0 < sample.host.mem_used_bytes < sample.host.mem_total_bytes
    sampler.close()


def test_real_pynvml_on_this_machine_never_raises() -> None:
    sampler = TelemetrySampler()
    sample = sampler()
    assert sample.gpus or sample.gpu_status  # either GPUs, or the reason there are none
    sampler.close()


def test_host_rates_are_per_second_between_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    counters: dict[str, Any] = {"t": 0.0, "read": 0, "sent": 0}
    from dagtop.io import telemetry

    monkeypatch.setattr(telemetry.psutil, "disk_io_counters",
                        lambda: types.SimpleNamespace(read_bytes=counters["read"], write_bytes=0))
    monkeypatch.setattr(telemetry.psutil, "net_io_counters",
                        lambda: types.SimpleNamespace(bytes_recv=0, bytes_sent=counters["sent"]))
    sampler = TelemetrySampler(nvml=types.SimpleNamespace(nvmlInit=lambda: 1 / 0),  # type: ignore[arg-type]
                               clock=lambda: counters["t"])
    first = sampler().host
    assert first is not None and first.disk_read_bytes_s == 0.0  # no previous sample: no rate yet
    counters.update(t=2.0, read=4_000_000, sent=1_000)
    second = sampler().host
    assert second is not None
    assert second.disk_read_bytes_s == pytest.approx(2_000_000) and second.net_tx_bytes_s == pytest.approx(500)


class _FakeNvml:
    """One GPU; PCIe and power in NVML's units (KB/s, mW); utilisation not supported."""

    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True
    def nvmlDeviceGetCount(self) -> int:
        return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"
    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA H100"
    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        raise pynvml.NVMLError_NotSupported()
    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return types.SimpleNamespace(used=2**30, total=80 * 2**30)
    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 1000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 2000
    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 250_000
    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return 1980 if clock == self.NVML_CLOCK_SM else 2619


def test_gpu_fields_are_converted_and_unsupported_ones_left_empty() -> None:
    nvml = _FakeNvml()
    sampler = TelemetrySampler(nvml=nvml)  # type: ignore[arg-type]
    (gpu,) = sampler().gpus
    assert gpu.name == "NVIDIA H100" and gpu.util_percent is None
    assert gpu.pcie_tx_bytes_s == 1000 * 1024 and gpu.pcie_rx_bytes_s == 2000 * 1024 and gpu.power_w == 250.0
    assert gpu.mem_used_bytes == 2**30 and gpu.sm_clock_mhz == 1980 and gpu.mem_clock_mhz == 2619
    sampler.close()
    assert nvml.shut


def test_telemetry_module_does_not_pull_in_textual() -> None:
    import subprocess

    code = "import dagtop.io.telemetry, sys; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --------------------------------------------------------------------------- the job's own telemetry (issue #11)

GIB = 2**30
JOB_HOST = "gpu-node-7.cluster.example.org"
"""Nothing like the machine the tests run on, nor like the fake monitor sample's "node0"."""


def _monitor() -> TelemetrySample:
    return TelemetrySample(HostSample("node0", 42.0, 16, 12 * GIB, 64 * GIB, 1.5e6, 2e5, 3e6, 4e6), (),
                           "no NVIDIA GPU (NVML library not found)")


def _sample(rank: int, host: str = JOB_HOST, local_rank: int | None = None, util: float = 97.0,
            gpu: bool = True, note: str = "") -> wire.Telemetry:
    local = rank if local_rank is None else local_rank
    return wire.Telemetry(
        0, rank, host, local, 1,
        HostStats(37.0, 96, 300 * GIB, 2000 * GIB) if local == 0 else None,
        GpuStats(local, "NVIDIA H100 80GB HBM3", util, 31 * GIB, 80 * GIB, 1.2e9, 3.4e9, 250.0) if gpu else None,
        note)


def with_telemetry(frames: list[RawFrame], every: int = 2, util: float | None = None) -> list[RawFrame]:
    """``frames`` with each rank's telemetry after every ``every``-th iteration frame, seqs renumbered per rank as
    one publisher numbers them; its GPU utilisation is ``util``, or the iteration number when None."""
    out, seq = [], defaultdict(int)
    for raw in frames:
        frame = wire.decode(raw.payload)
        batch: list[wire.Frame] = [frame]
        if isinstance(frame, wire.IterationBatch) and frame.iteration % every == 0:
            batch.append(_sample(frame.rank, util=float(frame.iteration) if util is None else util))
        for f in batch:
            out.append(RawFrame(raw.received_ns, wire.encode(dataclasses.replace(f, seq=seq[f.rank]))))
            seq[f.rank] += 1
    return out


# ----------------------------------------------------------------- the monitor: pipeline, report, record


def test_the_pipeline_keeps_each_ranks_latest_telemetry_as_state_not_iterations() -> None:
    plain = synthetic_frames(SyntheticJob(ranks=2), iterations=6)
    frames = with_telemetry(plain)
    alone, mixed = Pipeline(), Pipeline()
    alone.feed(plain)
    mixed.feed(frames[: len(frames) // 2])  # the replayed moment: half way
    half = mixed.snapshot().telemetry
    mixed.feed(frames[len(frames) // 2:])
    alone.finish()
    mixed.finish()
    snap = mixed.snapshot()
    assert [a.iteration for a in mixed.analyses()] == [a.iteration for a in alone.analyses()]
    assert (snap.rejected, snap.dropped, snap.incomplete) == (0, 0, 0)
    assert [(t.rank, t.host) for t in snap.telemetry] == [(0, JOB_HOST), (1, JOB_HOST)]
    assert {t.gpu.util_percent for t in snap.telemetry} == {4.0}  # type: ignore[union-attr]  # the last sent
    assert half and max(t.gpu.util_percent for t in half) < 4.0  # type: ignore[union-attr]
    assert mixed.snapshot().telemetry is snap.telemetry  # unchanged: the same tuple, the panel need not redraw


def test_malformed_or_foreign_telemetry_is_rejected_and_counted_never_raised() -> None:
    frames = synthetic_frames(SyntheticJob(ranks=2), iterations=2)
    bad = msgpack.unpackb(wire.encode(_sample(0)))
    bad["hw"]["cpu"] = 250.0
    pipeline = Pipeline()
    pipeline.feed([*frames, RawFrame(frames[-1].received_ns, msgpack.packb(bad)),
                   RawFrame(frames[-1].received_ns, wire.encode(dataclasses.replace(_sample(5), seq=99)))])
    snap = pipeline.snapshot()
    assert snap.rejected == 2 and "rank 5 is not below the world size 2" in (snap.last_rejection or "")
    assert snap.telemetry == ()


def _write(path: Path, frames: list[RawFrame]) -> Path:
    with RecordingWriter(path) as writer:
        for frame in frames:
            writer.append(frame)
    return path


def test_report_ignores_telemetry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = synthetic_frames(SyntheticJob(ranks=2, slow_ranks=(1,)), iterations=8)
    reports = []
    for name, frames in (("plain", plain), ("telemetry", with_telemetry(plain, every=1))):
        assert main(["report", str(_write(tmp_path / f"{name}.dagtop", frames)), "--json"]) == 0
        out = capsys.readouterr()
        assert "rejected" not in out.err
        reports.append(json.loads(out.out))
    assert reports[0] == reports[1] and reports[1]["rejected"] == 0 and reports[1]["dropped"] == 0


def test_record_keeps_telemetry_frames_without_counting_them_as_iterations_or_rejections(tmp_path: Path) -> None:
    frames = with_telemetry(synthetic_frames(SyntheticJob(ranks=2), iterations=6), every=1)
    with RecordingWriter(tmp_path / "r.dagtop") as writer:
        result = record(ListSource(frames, batch=5), writer)
    assert (result.frames, result.rejected, result.complete) == (len(frames), 0, 6)


# ----------------------------------------------------------------- the panel


def test_job_nodes_group_ranks_by_host_and_gpu() -> None:
    job = [_sample(0), _sample(1), _sample(2, host="zz", local_rank=0, gpu=False, note="on CPU"),
           _sample(3, host="zz", local_rank=1, gpu=False, note="on CPU"), dataclasses.replace(_sample(4), rank=4)]
    a, b = job_nodes(job)
    assert a.hostname == JOB_HOST and a.host is not None and a.host.cpu_percent == 37.0
    assert [(g.index, g.ranks) for g in a.gpus] == [(0, (0,)), (1, (1,)), (4, (4,))]
    assert b.gpus == () and b.notes == ("r2–3 on CPU",)
    assert rank_label([0, 1, 2, 3, 8, 10, 11]) == "r0–3,8,10–11"


# The telemetry panel's text area: 36 x 8 at 120 x 36, 27 x 3 at 80 x 24 (checked by the Pilot test below).
WIDE, NARROW = (36, 8), (27, 3)


@pytest.mark.parametrize("size", [WIDE, NARROW])
def test_one_host_one_gpu_shows_its_figures_whole(size: tuple[int, int]) -> None:
    lines = nodes_text(job_nodes([_sample(0)]), *size).plain.splitlines()
    assert len(lines) <= size[1] and all(len(line) <= size[0] for line in lines)
    assert lines[0] == ("gpu-node-7 CPU 37% mem 300/2000G" if size == WIDE else "gpu-node-7 CPU 37% mem 15%")
    assert lines[1].startswith("GPU0 r0 97% 31/80G 250W")
    assert lines[2].startswith("  pcie tx 1.2") and "rx 3.4" in lines[2]


def test_two_hosts_of_eight_gpus_fit_the_wide_panel_gpu_by_gpu() -> None:
    job = [_sample(r, host=f"node{r // 8}", local_rank=r % 8, util=90.0 + r % 8) for r in range(16)]
    lines = nodes_text(job_nodes(job), *WIDE).plain.splitlines()
    assert len(lines) == 8 and all(len(line) <= WIDE[0] for line in lines)
    assert lines[0].startswith("node0 CPU 37%") and lines[4].startswith("node1 CPU 37%")
    assert lines[1].startswith("GPU0 90% 31G  1 91% 31G") and "7 97% 31G" in lines[3]


def test_many_hosts_shrink_to_a_line_each_then_are_counted() -> None:
    job = [_sample(r, host=f"node{r // 8}", local_rank=r % 8) for r in range(64)]
    wide = nodes_text(job_nodes(job), *WIDE).plain.splitlines()
    assert wide[0] == "node0 CPU 37% · 8 GPUs 97%" and len(wide) == 8
    narrow = nodes_text(job_nodes(job), *NARROW).plain.splitlines()
    assert narrow == ["node0 CPU 37% · 8 GPUs 97%", "node1 CPU 37% · 8 GPUs 97%", "+6 more hosts"]
    longer = [_sample(r, host=f"gpu-node-{r // 8}", local_rank=r % 8, util=90.0 + r % 8) for r in range(16)]
    assert nodes_text(job_nodes(longer), *NARROW).plain.splitlines() == ["gpu-node-0 GPU 90–97%",
                                                                          "gpu-node-1 GPU 90–97%"]


def test_the_panel_says_whose_figures_it_shows() -> None:
    assert panel_title([_sample(0), _sample(9, host="other")], _monitor()) == "telemetry · job · 2 hosts"
    assert panel_title([], _monitor()) == "telemetry · this host (monitor)"
    assert panel_title([], _monitor(), 25) == "this host (monitor)"  # 80x24: whose, rather than cut (issue #30)
    assert panel_title([_sample(0), _sample(9, host="other")], _monitor(), 24) == "job · 2 hosts"
    assert "node0" in panel_text([], _monitor(), live=True).plain  # the fallback: an older shim sends none
    job = panel_text([_sample(0)], _monitor(), live=True).plain
    assert "gpu-node-7" in job and "node0" not in job  # once the job sends its own, the monitor's is gone
    assert "no telemetry from the job" in panel_text([], None, live=False).plain


def _panel(app: Any) -> tuple[str, str, tuple[int, int]]:
    widget = app.query_one(Telemetry)
    return str(widget.border_title), widget.render().plain, (widget.size.width, widget.size.height)


@pytest.mark.parametrize(("size", "panel"), [((120, 36), WIDE), ((80, 24), NARROW)])
def test_a_replayed_recording_shows_the_jobs_telemetry_not_the_monitors(
        tmp_path: Path, size: tuple[int, int], panel: tuple[int, int]) -> None:
    path = _write(tmp_path / "job.dagtop", with_telemetry(synthetic_frames(SyntheticJob(ranks=2), iterations=6)))
    # A sampler given even so (as the screenshot tests do): the job's telemetry wins over it.
    app = make_app(RecordingSource(path, speed=0), sampler=_monitor, source_label="replay job.dagtop")

    async def body() -> tuple[str, str, tuple[int, int]]:
        async with app.run_test(size=size) as pilot:
            for _ in range(200):
                if app.shown.finished and app.query_one(Telemetry).job:
                    break
                await pilot.pause(0.05)
            await pilot.pause()
            return _panel(app)

    title, text, shown = asyncio.run(body())
    assert shown == panel
    assert title == "telemetry · job · 1 host"
    assert "gpu-node-7 CPU 37%" in text and "GPU0 r0 4% 31/80G 250W" in text  # as of the last frame: iteration 4
    assert "node0" not in text and socket.gethostname().split(".")[0] not in text
    assert all(len(line) <= panel[0] for line in text.splitlines()) and len(text.splitlines()) <= panel[1]


def test_live_the_monitors_host_stands_in_until_the_job_sends_telemetry() -> None:
    from test_ui_app import FakeLiveSource

    source = FakeLiveSource()
    app = make_app(source, sampler=_monitor, frame_interval_s=0.02)
    frames = with_telemetry(synthetic_frames(SyntheticJob(ranks=2), iterations=4))

    async def body() -> list[tuple[str, str, tuple[int, int]]]:
        seen = []
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.2)
            seen.append(_panel(app))
            source.push(frames)
            for _ in range(200):
                if app.query_one(Telemetry).job:
                    break
                await pilot.pause(0.02)
            await pilot.pause()
            seen.append(_panel(app))
        return seen

    before, after = asyncio.run(body())
    assert before[0] == "telemetry · this host (monitor)" and "node0 CPU 42%" in before[1]
    assert after[0] == "telemetry · job · 1 host" and "gpu-node-7" in after[1] and "node0" not in after[1]
