"""Host and GPU telemetry as the panel draws it: the job's, sent by its ranks, or else the monitor's own machine.

The ranks sample their hosts and GPUs themselves (``instrument/telemetry.py``) and send ``telemetry`` frames;
:func:`job_nodes` turns each rank's latest frame into one :class:`Node` per host. Until a job sends any (a shim
older than that frame), :class:`TelemetrySampler` samples the monitor's machine with psutil and NVML, and
:func:`monitor_nodes` shows it as one node, labelled as the monitor's. No Textual here: the collector thread
samples, the screen draws the frozen result.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from instrument import wire
from instrument.wire_fields import GpuStats


@dataclass(frozen=True, slots=True)
class HostSample:
    """CPU, memory, disk and network of a host; rates are per second since the previous sample.

    The monitor's own sample has every field; a job's host has CPU and memory only (None: not measured there).
    """

    hostname: str
    cpu_percent: float | None
    cpus: int | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    disk_read_bytes_s: float | None = None
    disk_write_bytes_s: float | None = None
    net_rx_bytes_s: float | None = None
    net_tx_bytes_s: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVIDIA GPU; a field is None where the device does not support it."""

    index: int
    name: str
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    pcie_tx_bytes_s: float | None
    pcie_rx_bytes_s: float | None
    power_w: float | None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    ranks: tuple[int, ...] = ()
    """The job's ranks on this GPU (empty for the monitor's own GPUs)."""


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    """One sample of everything; ``gpu_status`` explains an empty ``gpus`` (no GPU, no driver)."""

    host: HostSample | None
    gpus: tuple[GpuSample, ...]
    gpu_status: str | None


Sampler = Callable[[], TelemetrySample]
"""Anything that returns a sample: the real :class:`TelemetrySampler` or a fake in tests."""


@dataclass(frozen=True, slots=True)
class Node:
    """One host's block in the panel: its CPU and memory, its GPUs, and a line for ranks without GPU figures."""

    hostname: str
    host: HostSample | None
    """None when no rank of the host sends host-wide figures (only local rank 0 does)."""
    gpus: tuple[GpuSample, ...]
    notes: tuple[str, ...] = ()
    """Ranks without GPU figures and why ("r0–1 on CPU"), or why the monitor sees no GPU."""


def rank_label(ranks: Sequence[int]) -> str:
    """``r0``, ``r0,2``, ``r0–3``, ``r0–3,8–11``: runs of consecutive ranks as ranges."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return "r" + ",".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


def job_nodes(telemetry: Sequence[wire.Telemetry]) -> tuple[Node, ...]:
    """One node per host of the job from each rank's latest telemetry; ranks sharing a GPU share its line."""
    hosts: dict[str, list[wire.Telemetry]] = {}
    for t in telemetry:
        hosts.setdefault(t.host, []).append(t)
    nodes = []
    for hostname in sorted(hosts):
        ranks = sorted(hosts[hostname], key=lambda t: (t.local_rank, t.rank))
        hw = next((t.host_stats for t in ranks if t.host_stats is not None), None)
        host = None if hw is None else HostSample(hostname, hw.cpu_percent, hw.cpus, hw.mem_used, hw.mem_total)
        on_gpu: dict[int, tuple[GpuStats, list[int]]] = {}
        without: dict[str, list[int]] = {}
        for t in ranks:
            if t.gpu is not None:
                on_gpu.setdefault(t.gpu.index, (t.gpu, []))[1].append(t.rank)
            else:
                without.setdefault(t.note or "sent no GPU figures", []).append(t.rank)
        gpus = tuple(
            GpuSample(g.index, g.name, g.util_percent, g.mem_used, g.mem_total, g.pcie_tx, g.pcie_rx, g.power_w,
                      ranks=tuple(sorted(on)))
            for g, on in (on_gpu[i] for i in sorted(on_gpu)))
        notes = tuple(f"{rank_label(on)} {note}" for note, on in without.items())
        nodes.append(Node(hostname, host, gpus, notes))
    return tuple(nodes)


def monitor_nodes(sample: TelemetrySample) -> tuple[Node, ...]:
    """The monitor's own machine as one node (the fallback while the job sends no telemetry)."""
    hostname = sample.host.hostname if sample.host is not None else socket.gethostname()
    notes = (sample.gpu_status or "no GPU",) if not sample.gpus else ()
    return (Node(hostname, sample.host, sample.gpus, notes),)


def _nvml_reason(exc: Exception) -> str:
    name = type(exc).__name__
    if "LibraryNotFound" in name:
        return "no NVIDIA GPU (NVML library not found)"
    if "DriverNotLoaded" in name:
        return "no NVIDIA GPU (driver not loaded)"
    return f"GPU telemetry unavailable ({exc})"


class TelemetrySampler:
    """Samples psutil and, when it loads, NVML. Call it from one thread; it keeps counters between calls.

    Args:
        nvml: the pynvml module (injected by tests); imported lazily when None.
        clock: monotonic seconds, for rates.
    """

    def __init__(self, nvml: ModuleType | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._clock = clock
        self._nvml_ready: bool | None = None
        self._gpu_status: str | None = None
        self._handles: list[Any] = []
        self._last: tuple[float, Any, Any] | None = None
        self._hostname = socket.gethostname()
        psutil.cpu_percent(None)  # the first call only starts the measurement interval

    def __call__(self) -> TelemetrySample:
        return TelemetrySample(self._host(), self._gpus(), self._gpu_status)

    def close(self) -> None:
        """Shut NVML down if it was started."""
        if self._nvml_ready and self._nvml is not None:
            with contextlib.suppress(Exception):  # shutting down a library that already failed is no error
                self._nvml.nvmlShutdown()
        self._nvml_ready = False

    def _host(self) -> HostSample | None:
        try:
            now = self._clock()
            disk = psutil.disk_io_counters()
            net = psutil.net_io_counters()
            mem = psutil.virtual_memory()
            cpu = psutil.cpu_percent(None)
        except (OSError, RuntimeError):
            return None
        rates = [0.0, 0.0, 0.0, 0.0]
        if self._last is not None:
            then, disk0, net0 = self._last
            dt = max(now - then, 1e-6)
            pairs = [(disk, disk0, "read_bytes"), (disk, disk0, "write_bytes"),
                     (net, net0, "bytes_recv"), (net, net0, "bytes_sent")]
            for i, (cur, old, field) in enumerate(pairs):
                if cur is not None and old is not None:
                    rates[i] = max(0.0, (getattr(cur, field) - getattr(old, field)) / dt)
        self._last = (now, disk, net)
        return HostSample(self._hostname, cpu, psutil.cpu_count() or 1, mem.total - mem.available, mem.total, *rates)

    def _start_nvml(self) -> bool:
        if self._nvml_ready is not None:
            return self._nvml_ready
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml_ready = True
            if not self._handles:
                self._gpu_status = "NVML found no GPU"
        except Exception as exc:  # noqa: BLE001 - any NVML failure means: no GPU telemetry, say why
            self._nvml_ready = False
            self._gpu_status = _nvml_reason(exc)
        return self._nvml_ready

    def _gpus(self) -> tuple[GpuSample, ...]:
        if not self._start_nvml():
            return ()
        nv = self._nvml
        assert nv is not None

        def get(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(*args)
            except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: leave the field empty
                return None

        out = []
        for i, h in enumerate(self._handles):
            name = get(nv.nvmlDeviceGetName, h)
            util = get(nv.nvmlDeviceGetUtilizationRates, h)
            mem = get(nv.nvmlDeviceGetMemoryInfo, h)
            tx = get(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
            rx = get(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
            power = get(nv.nvmlDeviceGetPowerUsage, h)
            sm_clock = get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            mem_clock = get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            out.append(GpuSample(
                index=i,
                name=name.decode() if isinstance(name, bytes) else str(name or f"GPU {i}"),
                util_percent=float(util.gpu) if util is not None else None,
                mem_used_bytes=int(mem.used) if mem is not None else None,
                mem_total_bytes=int(mem.total) if mem is not None else None,
                pcie_tx_bytes_s=tx * 1024.0 if tx is not None else None,  # NVML reports KB/s
                pcie_rx_bytes_s=rx * 1024.0 if rx is not None else None,
                power_w=power / 1000.0 if power is not None else None,  # NVML reports mW
                sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
                mem_clock_mhz=int(mem_clock) if mem_clock is not None else None,
            ))
        return tuple(out)
