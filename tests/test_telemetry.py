"""Telemetry: host counters from psutil, GPUs from NVML, and a clean message where there is no GPU."""

from __future__ import annotations

import types
from typing import Any

import pynvml
import pytest

from dagtop.telemetry import TelemetrySampler


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
    import dagtop.telemetry as telemetry

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
    import sys

    code = "import dagtop.telemetry, sys; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
