"""A rank's own host and GPU telemetry: sampled on its own daemon thread every few seconds, never on training's.

Host-wide CPU and memory come from ``/proc`` (Linux), read directly: a rank need not import psutil, a compiled
extension the shim's dependencies (stdlib, pyzmq, msgpack) do without, for two files it parses in microseconds.
The GPU comes from NVML through nvidia-ml-py, imported on the sampling thread at its first sample. Whatever
fails (no /proc, no nvidia-ml-py, no driver, a figure the device does not support, a permission error) leaves
that figure None and says why in the frame's ``note``: never an exception, never a warning into training.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from instrument import wire
from instrument.background import run_in_the_background
from instrument.wire_fields import MAX_NAME_CHARS, MAX_NOTE_CHARS, MAX_RATE, GpuStats, HostStats

EVERY_S: Final = 2.0
"""Seconds between two samples: the panel's pace; a sample costs the rank tens of microseconds of CPU."""
FIRST_AFTER_S: Final = 1.0
"""The first sample waits this long, so that its CPU figure covers a second of the job, not time since boot."""


class HostProbe:
    """Host-wide CPU use and memory from ``/proc/stat`` and ``/proc/meminfo``.

    Args:
        proc: where procfs is mounted (tests point it at a directory of their own).
    """

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._cpus = os.cpu_count()
        self._last = self._cpu_times()

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs; None without a readable /proc/stat."""
        try:
            with open(os.path.join(self._proc, "stat"), "rb") as f:
                fields = f.readline().split()
            # cpu user nice system idle iowait irq softirq steal (guest time is inside user already)
            ticks = [int(x) for x in fields[1:9]]
            if fields[0] != b"cpu" or len(ticks) < 4:
                return None
        except (OSError, ValueError, IndexError):
            return None
        total = sum(ticks)
        return total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total

    def _memory(self) -> tuple[int | None, int | None]:
        """(used, total) bytes: used is total minus MemAvailable, as ``free`` and psutil count it."""
        found: dict[bytes, int] = {}
        try:
            with open(os.path.join(self._proc, "meminfo"), "rb") as f:
                for line in f:
                    key, _, rest = line.partition(b":")
                    if key in (b"MemTotal", b"MemAvailable"):
                        found[key] = int(rest.split()[0]) * 1024
                        if len(found) == 2:
                            break
        except (OSError, ValueError, IndexError):
            return None, None
        total, available = found.get(b"MemTotal"), found.get(b"MemAvailable")
        if total is None or available is None:
            return None, total
        return max(0, min(total, total - available)), total

    def sample(self) -> HostStats | None:
        """The figures since the previous call; None if the host offers none of them."""
        cpu = None
        now = self._cpu_times()
        if now is not None and self._last is not None and now[1] > self._last[1]:
            cpu = min(100.0, max(0.0, 100.0 * (now[0] - self._last[0]) / (now[1] - self._last[1])))
        self._last = now if now is not None else self._last
        used, total = self._memory()
        if cpu is None and total is None:
            return None
        return HostStats(cpu, self._cpus, used, total)


def _nvml_reason(exc: BaseException) -> str:
    name = type(exc).__name__
    if isinstance(exc, ImportError):
        return "no GPU figures: nvidia-ml-py not installed"
    if "LibraryNotFound" in name:
        return "no GPU figures: NVML library not found"
    if "DriverNotLoaded" in name:
        return "no GPU figures: NVIDIA driver not loaded"
    if "NoPermission" in name:
        return "no GPU figures: NVML permission denied"
    return f"no GPU figures: {name}: {exc}"[: MAX_NOTE_CHARS]


def _hex(uuid: Any) -> str:
    """A GPU UUID as bare lowercase hex, whichever way it was written (NVML's "GPU-…", torch's, bytes)."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return "".join(c for c in text.lower().removeprefix("gpu-") if c in "0123456789abcdef")


class GpuProbe:
    """The rank's own GPU through NVML. :meth:`start` once, then :meth:`sample`, both on the sampling thread.

    Args:
        cuda_index: the rank's CUDA device index (relative to CUDA_VISIBLE_DEVICES).
        nvml: the pynvml module (tests pass a fake); imported in :meth:`start` when None.
    """

    def __init__(self, cuda_index: int, nvml: Any = None) -> None:
        self.cuda_index = cuda_index
        self._nvml = nvml
        self._handle: Any = None
        self.index = cuda_index
        """NVML's index of the device once found (the number nvidia-smi shows)."""
        self.name = ""

    def start(self) -> str:
        """Load NVML and find the rank's device; returns "" or why there will be no GPU figures."""
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_*, OSError: all mean no figures
            self._nvml = None
            return _nvml_reason(exc)
        try:
            self.index = self._nvml_index()
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.index)
            name = self._nvml.nvmlDeviceGetName(self._handle)
            self.name = (name.decode() if isinstance(name, bytes) else str(name))[: MAX_NAME_CHARS]
        except Exception as exc:  # noqa: BLE001
            self.close()
            return _nvml_reason(exc)
        return ""

    def _nvml_index(self) -> int:
        """NVML numbers GPUs by PCI bus; CUDA by speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and through
        CUDA_VISIBLE_DEVICES. The UUID is the one name both share; without torch loaded, the environment says."""
        nv = self._nvml
        torch = sys.modules.get("torch")
        if torch is not None:
            with contextlib.suppress(Exception):  # an older torch without .uuid: the environment below says
                wanted = _hex(torch.cuda.get_device_properties(self.cuda_index).uuid)
                for i in range(nv.nvmlDeviceGetCount()):
                    if _hex(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))) == wanted:
                        return i
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if self.cuda_index < len(visible):
            chosen = visible[self.cuda_index]
            if chosen.isdigit():
                return int(chosen)
            handle = nv.nvmlDeviceGetHandleByUUID(chosen.encode())
            return int(nv.nvmlDeviceGetIndex(handle))
        return self.cuda_index

    def sample(self) -> GpuStats | None:
        """The device's figures now; a figure the device does not support is None."""
        nv, h = self._nvml, self._handle
        if nv is None or h is None:
            return None

        def read(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception:  # noqa: BLE001 - NVMLError_NotSupported, NoPermission, GpuIsLost: no figure
                return None

        util = read(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = read(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        # Each PCIe reading takes NVML 20 ms (a counter over a 20 ms window); ctypes releases the GIL meanwhile.
        tx = read(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        rx = read(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        power = read(lambda: nv.nvmlDeviceGetPowerUsage(h))
        used = total = None
        if mem is not None and 0 <= int(mem.used) <= int(mem.total):
            used, total = int(mem.used), int(mem.total)
        return GpuStats(
            index=self.index, name=self.name,
            util_percent=_clamp(util.gpu if util is not None else None, 100.0),
            mem_used=used, mem_total=total,
            pcie_tx=_clamp(tx * 1024.0 if tx is not None else None),  # NVML says KB/s
            pcie_rx=_clamp(rx * 1024.0 if rx is not None else None),
            power_w=_clamp(power / 1000.0 if power is not None else None),  # NVML says mW
        )

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # shutting down what failed is no error
                self._nvml.nvmlShutdown()
        self._nvml = self._handle = None


def _clamp(value: float | None, hi: float = MAX_RATE) -> float | None:
    """A reading the wire accepts, or None (a driver's odd value must not get the whole frame refused)."""
    if value is None:
        return None
    value = float(value)
    return value if 0.0 <= value <= hi else None


class TelemetryThread:
    """Samples the rank's host (local rank 0 only) and GPU every :data:`EVERY_S` and hands each sample on.

    Args:
        put: takes each sample (the publisher's :meth:`~instrument.publisher.Publisher.put_telemetry`: a
            reference assignment; the publisher thread stamps the seq and sends it).
        rank, local_rank, host: who samples; only local rank 0 reads the host-wide figures.
        cuda_index: the rank's CUDA device, or None on a CPU rank.
        every_s, first_after_s: seconds between samples, and before the first (default :data:`EVERY_S`,
            :data:`FIRST_AFTER_S`).
        host_probe, gpu_probe: injected by tests; built on the sampling thread when None.
    """

    def __init__(self, put: Callable[[wire.Telemetry], None], *, rank: int, local_rank: int, host: str,
                 cuda_index: int | None, every_s: float | None = None, first_after_s: float | None = None,
                 host_probe: HostProbe | None = None, gpu_probe: GpuProbe | None = None) -> None:
        self._put = put
        self.rank, self.local_rank, self.host = rank, local_rank, host[: MAX_NAME_CHARS]
        self.cuda_index = cuda_index
        self.every_s = EVERY_S if every_s is None else every_s
        self.first_after_s = FIRST_AFTER_S if first_after_s is None else first_after_s
        self._host_probe, self._gpu_probe = host_probe, gpu_probe
        self.samples = 0
        self.cpu_ns = 0
        """This thread's CPU time as of its last sample (``time.thread_time_ns``), which the process's CPU time
        beside the training thread is counted without."""
        self.failure: BaseException | None = None
        """What stopped the thread early, if anything (kept for tests; training is never told)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dagtop-telemetry", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop sampling; returns at once (a sample in flight finishes on its own, the thread is a daemon)."""
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        gpu = self._gpu_probe
        try:
            run_in_the_background()
            host = self._host_probe
            if host is None and self.local_rank == 0:
                host = HostProbe()
            note = "on CPU" if self.cuda_index is None else ""
            if gpu is None and self.cuda_index is not None:
                gpu = GpuProbe(self.cuda_index)
            if gpu is not None:
                note = gpu.start()
            wait = self.first_after_s
            self.cpu_ns = time.thread_time_ns()
            while not self._stop.wait(wait):
                started = time.monotonic()
                self._put(wire.Telemetry(
                    seq=0, rank=self.rank, host=self.host, local_rank=self.local_rank,
                    mono_ns=time.perf_counter_ns(), host_stats=host.sample() if host is not None else None,
                    gpu=gpu.sample() if gpu is not None else None, note=note,
                ))
                self.samples += 1
                self.cpu_ns = time.thread_time_ns()
                wait = max(0.0, self.every_s - (time.monotonic() - started))
        except BaseException as exc:  # noqa: BLE001 - telemetry is a nicety: it stops, training never hears of it
            self.failure = exc
        finally:
            if gpu is not None:
                gpu.close()
