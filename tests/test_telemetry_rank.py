"""Telemetry in the rank: the host figures from /proc, the rank's own GPU through NVML, and the thread that sends
them; never an exception into training."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from helpers.waits import until
from test_telemetry import GIB, _FakeNvml

from instrument import telemetry as shim
from instrument import wire
from instrument.wire_fields import GpuStats, HostStats

# ----------------------------------------------------------------- in the rank: /proc, NVML, the thread


def _proc(tmp_path: Path, busy: int, idle: int, available_kb: int = 3_000_000) -> str:
    (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "meminfo").write_text(f"MemTotal: 8000000 kB\nMemFree: 1 kB\nMemAvailable: {available_kb} kB\n")
    return str(tmp_path)


def test_host_probe_reads_cpu_use_between_samples_and_memory_from_proc(tmp_path: Path) -> None:
    probe = shim.HostProbe(_proc(tmp_path, busy=1000, idle=9000))
    _proc(tmp_path, busy=1300, idle=9100)  # 300 busy of 400 jiffies since the probe started
    stats = probe.sample()
    assert stats is not None and stats.cpu_percent == pytest.approx(75.0)
    assert (stats.mem_used, stats.mem_total) == ((8_000_000 - 3_000_000) * 1024, 8_000_000 * 1024)
    assert probe.sample().cpu_percent is None  # type: ignore[union-attr]  # no time passed: no figure, no 0/0


def test_host_probe_without_proc_gives_nothing_and_raises_nothing(tmp_path: Path) -> None:
    assert shim.HostProbe(str(tmp_path / "absent")).sample() is None
    (tmp_path / "stat").write_text("garbage\n")
    (tmp_path / "meminfo").write_text("MemTotal: lots\n")
    assert shim.HostProbe(str(tmp_path)).sample() is None


class _RankNvml(_FakeNvml):
    """Four GPUs on the host; their UUIDs say which is which."""

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> str:
        return f"h{uuid.decode()[11]}"

    def nvmlDeviceGetIndex(self, h: str) -> int:
        return int(h[1])

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return types.SimpleNamespace(gpu=88)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return -5  # a driver's odd reading: dropped, not sent (the monitor would refuse the whole frame)


def test_gpu_probe_finds_the_ranks_gpu_and_converts_nvml_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    probe = shim.GpuProbe(1, nvml=_RankNvml())
    assert probe.start() == "" and probe.index == 2  # CUDA's device 1 is the host's GPU 2
    stats = probe.sample()
    assert stats == GpuStats(2, "NVIDIA H100", 88.0, GIB, 80 * GIB, 1000 * 1024.0, 2000 * 1024.0, None)
    sent = wire.decode(wire.encode(wire.Telemetry(0, 1, "h", 1, 1, None, stats)))
    assert isinstance(sent, wire.Telemetry) and sent.gpu == stats
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd")
    probe = shim.GpuProbe(0, nvml=_RankNvml())
    assert probe.start() == "" and probe.index == 1


def test_gpu_probe_prefers_the_uuid_torch_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML by PCI bus: the UUID decides."""
    props = types.SimpleNamespace(uuid="00000003-aaaa-bbbb-cccc-dddddddddddd")
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda i: props))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe = shim.GpuProbe(0, nvml=_RankNvml())
    assert probe.start() == "" and probe.index == 3


def test_gpu_probe_without_nvidia_ml_py_or_a_driver_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert shim.GpuProbe(0).start() == "no GPU figures: nvidia-ml-py not installed"
    fails = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(pynvml.NVMLError_LibraryNotFound()))
    probe = shim.GpuProbe(0, nvml=fails)
    assert probe.start() == "no GPU figures: NVML library not found" and probe.sample() is None


def _collect(thread: shim.TelemetryThread, got: list[wire.Telemetry], n: int) -> None:
    for _ in range(500):
        if len(got) >= n or not thread.alive:
            break
        time.sleep(0.01)
    thread.close()


def test_the_thread_samples_host_wide_figures_on_local_rank_0_only(tmp_path: Path) -> None:
    got: list[wire.Telemetry] = []
    first = shim.TelemetryThread(got.append, rank=8, local_rank=0, host="n1", cuda_index=None, every_s=0.01,
                                 first_after_s=0.0, host_probe=shim.HostProbe(_proc(tmp_path, 1, 1)))
    _collect(first, got, 2)
    other: list[wire.Telemetry] = []
    second = shim.TelemetryThread(other.append, rank=9, local_rank=1, host="n1", cuda_index=None, every_s=0.01,
                                  first_after_s=0.0)
    _collect(second, other, 2)
    assert len(got) >= 2 and got[0].host_stats is not None and got[0].host == "n1" and got[0].note == "on CPU"
    assert len(other) >= 2 and all(t.host_stats is None and t.gpu is None and t.rank == 9 for t in other)


def test_a_failing_probe_stops_telemetry_quietly(recwarn: pytest.WarningsRecorder) -> None:
    class Broken(shim.HostProbe):
        def sample(self) -> HostStats | None:
            raise PermissionError("/proc/stat")

    got: list[wire.Telemetry] = []
    thread = shim.TelemetryThread(got.append, rank=0, local_rank=0, host="n", cuda_index=None, every_s=0.01,
                                  first_after_s=0.0, host_probe=Broken())
    _collect(thread, got, 1)
    assert until(lambda: not thread.alive)
    assert not got and isinstance(thread.failure, PermissionError) and not recwarn.list
