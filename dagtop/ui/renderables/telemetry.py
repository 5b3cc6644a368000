"""The telemetry panel: the monitor host's CPU, memory, disk and network, and each NVIDIA GPU."""

from __future__ import annotations

from rich.text import Text

from dagtop.telemetry import GpuSample, TelemetrySample

GIB = 1024**3


def rate(bytes_per_s: float | None) -> str:
    """``12.3 MB/s`` style, decimal units as network and disk tools print them."""
    if bytes_per_s is None:
        return "–"
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= div:
            return f"{bytes_per_s / div:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _gib(n: int | None) -> str:
    return "–" if n is None else f"{n / GIB:.1f}"


def _gpu_lines(g: GpuSample) -> list[Text]:
    """Three short lines per GPU, each whole in the panel at 120 x 36; at 80 x 24 the first two show."""
    util = "–" if g.util_percent is None else f"{g.util_percent:.0f} %"
    power = "–" if g.power_w is None else f"{g.power_w:.0f} W"
    clock = "" if g.sm_clock_mhz is None else f" {g.sm_clock_mhz} MHz"
    name = g.name.removeprefix("NVIDIA ")[:9].rstrip()
    return [
        Text.assemble((f"GPU{g.index} ", "bold"), f"{name} util {util}"),
        Text(f"mem {_gib(g.mem_used_bytes)}/{_gib(g.mem_total_bytes)} GiB {power}{clock}"),
        Text(f"pcie tx {rate(g.pcie_tx_bytes_s)} rx {rate(g.pcie_rx_bytes_s)}"),
    ]


def telemetry_text(sample: TelemetrySample | None) -> Text:
    """A few lines: host first, then a line per GPU or the reason there is none."""
    if sample is None:
        return Text("sampling…", style="dim")
    lines = [line for g in sample.gpus for line in _gpu_lines(g)]
    if not sample.gpus:
        lines.append(Text(sample.gpu_status or "no GPU", style="dim"))
    h = sample.host
    if h is None:
        lines.append(Text("host counters unavailable", style="dim"))
    else:
        lines.append(Text.assemble((h.hostname, "bold"), f"  CPU {h.cpu_percent:.0f} % of {h.cpus}"))
        lines.append(Text(f"mem {_gib(h.mem_used_bytes)}/{_gib(h.mem_total_bytes)} GiB"))
        lines.append(Text(f"disk r {rate(h.disk_read_bytes_s)} w {rate(h.disk_write_bytes_s)}"))
        lines.append(Text(f"net rx {rate(h.net_rx_bytes_s)} tx {rate(h.net_tx_bytes_s)}"))
    return Text("\n").join(lines)
