"""The telemetry panel: one short block per host of the job (CPU, memory, its GPUs), or the monitor's own host.

The blocks lose detail, all hosts together, until they fit the panel's height: two lines per GPU, then one,
then a few GPUs to a line (utilisation and memory), then one line per host's GPUs, then one line per host;
hosts that still do not fit are counted. Every line is cut at the panel's width, the least telling words last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text

from dagtop.io.telemetry import (
    GpuSample,
    Node,
    TelemetrySample,
    job_nodes,
    monitor_nodes,
    rank_label,
)
from instrument import wire

GIB = 1024**3


def rate(bytes_per_s: float | None) -> str:
    """``12.3 MB/s`` style, decimal units as network and disk tools print them."""
    if bytes_per_s is None:
        return "–"
    for unit, div in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= div:
            return f"{bytes_per_s / div:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _short_rate(bytes_per_s: float | None) -> str:
    """``1.2G``: the rate without its unit's tail, for a narrow panel."""
    return rate(bytes_per_s).replace(" ", "").removesuffix("B/s").replace("k", "K")


def _gib(n: int | None) -> str:
    if n is None:
        return "–"
    g = n / GIB
    return f"{g:.1f}" if g < 9.95 else f"{g:.0f}"


def _mem(used: int | None, total: int | None) -> str:
    return f"{_gib(used)}/{_gib(total)}G"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}%"


def _watts(value: float | None) -> str:
    if value is None:
        return "–W"
    return f"{value / 1000:.1f}kW" if value >= 999.5 else f"{value:.0f}W"


def _short_name(node: Node) -> str:
    """The host's first DNS label: ``gpu017`` of ``gpu017.cluster.example.org``."""
    return node.hostname.split(".")[0] or node.hostname


def _header(node: Node, width: int) -> Text:
    """``node0 CPU 42% of 16 mem 12/64G``: the short host name in bold."""
    name = _short_name(node)
    h = node.host
    if h is None:
        return Text(name, style="bold")
    cpu, cpus = f" CPU {_pct(h.cpu_percent)}", f" of {h.cpus}" if h.cpus else ""
    mem = f" mem {_mem(h.mem_used_bytes, h.mem_total_bytes)}"
    used, total = h.mem_used_bytes, h.mem_total_bytes
    share = f" mem {_pct(100 * used / total)}" if used is not None and total else mem
    # What gives up first as the panel narrows: the core count, then memory in bytes (a share instead).
    figures = next((f for f in (cpu + cpus + mem, cpu + mem, cpu + share) if len(name) + len(f) <= width),
                   cpu + share)
    return Text.assemble((name, "bold"), figures)


def _one_line(node: Node, width: int) -> Text:
    """``node0 CPU 42% · 8 GPUs 91–99%``: a host in a line, when there are too many hosts for more; narrower, the
    GPU count goes, then the CPU (on a GPU node the GPUs tell more)."""
    name = _short_name(node)
    cpu = f" CPU {_pct(node.host.cpu_percent)}" if node.host is not None else ""
    if not node.gpus:
        return Text.assemble((name, "bold"), cpu)
    util = _gpu_summary(node.gpus, brief=True).split(" ", 2)[2]
    choices = (f"{cpu} · {_gpu_summary(node.gpus, brief=True)}", f"{cpu} GPU {util}", f" GPU {util}")
    return Text.assemble((name, "bold"), next((c for c in choices if len(name) + len(c) <= width), choices[-1]))


def _gpu_line(g: GpuSample) -> Text:
    """``GPU0 r0 97% 31/80G 250W H100``: what nvidia-smi's first columns say; the name last, the first to go."""
    ranks = f" {rank_label(g.ranks)}" if g.ranks else ""
    clock = "" if g.sm_clock_mhz is None else f" {g.sm_clock_mhz}MHz"
    name = g.name
    for vendor in ("NVIDIA ", "GeForce ", "Tesla "):
        name = name.removeprefix(vendor)
    name = name[:9].rstrip()
    return Text.assemble((f"GPU{g.index}", "bold"), f"{ranks} {_pct(g.util_percent)} "
                         f"{_mem(g.mem_used_bytes, g.mem_total_bytes)} {_watts(g.power_w)}{clock} {name}".rstrip())


def _pcie_line(g: GpuSample, width: int) -> Text:
    full = f"  pcie tx {rate(g.pcie_tx_bytes_s)} rx {rate(g.pcie_rx_bytes_s)}"
    if len(full) <= width:
        return Text(full)
    return Text(f"  pcie tx {_short_rate(g.pcie_tx_bytes_s)} rx {_short_rate(g.pcie_rx_bytes_s)} B/s")


def _gpu_cells(gpus: Sequence[GpuSample], width: int) -> list[Text]:
    """``GPU0 97% 31G  1 95% 31G  2 96% 30G``: as many GPUs to a line as fit, utilisation and memory used."""
    cells = [f"{g.index} {_pct(g.util_percent)} {_gib(g.mem_used_bytes)}G" for g in gpus]
    lines: list[str] = []
    for cell in cells:
        if lines and len(lines[-1]) + 2 + len(cell) <= width:
            lines[-1] += "  " + cell
        else:
            lines.append(("GPU" if not lines else "   ") + cell)
    return [Text(line) for line in lines]


def _gpu_summary(gpus: Sequence[GpuSample], brief: bool = False) -> str:
    """``8 GPUs 91–99% 620/640G 2.0kW``: a host's GPUs in one line; ``brief``: their utilisation only."""
    utils = [g.util_percent for g in gpus if g.util_percent is not None]
    util = "–" if not utils else f"{min(utils):.0f}%" if min(utils) == max(utils) else \
        f"{min(utils):.0f}–{max(utils):.0f}%"

    def total(values: list[int | None] | list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    used, size = total([g.mem_used_bytes for g in gpus]), total([g.mem_total_bytes for g in gpus])
    mem = _mem(None if used is None else int(used), None if size is None else int(size))
    plural = "s" if len(gpus) > 1 else ""
    if brief:
        return f"{len(gpus)} GPU{plural} {util}"
    return f"{len(gpus)} GPU{plural} {util} {mem} {_watts(total([g.power_w for g in gpus]))}"


def _notes(node: Node) -> list[Text]:
    return [Text(note, style="dim") for note in node.notes]


def _extras(node: Node) -> list[Text]:
    """Disk and network: only the monitor's own sample has them."""
    h = node.host
    if h is None or h.disk_read_bytes_s is None:
        return []
    return [Text(f"  disk r {rate(h.disk_read_bytes_s)} w {rate(h.disk_write_bytes_s)}"),
            Text(f"  net rx {rate(h.net_rx_bytes_s)} tx {rate(h.net_tx_bytes_s)}")]


Block = Callable[[Node, int], list[Text]]
"""One host's lines at one level of detail, for a panel ``width`` columns wide."""

_LEVELS: tuple[Block, ...] = (
    lambda n, w: [_header(n, w), *(x for g in n.gpus for x in (_gpu_line(g), _pcie_line(g, w))), *_notes(n),
                  *_extras(n)],
    lambda n, w: [_header(n, w), *(x for g in n.gpus for x in (_gpu_line(g), _pcie_line(g, w))), *_notes(n)],
    lambda n, w: [_header(n, w), *(_gpu_line(g) for g in n.gpus), *_notes(n)],
    lambda n, w: [_header(n, w), *_gpu_cells(n.gpus, w), *_notes(n)],
    lambda n, w: [_header(n, w), *([Text("  " + _gpu_summary(n.gpus))] if n.gpus else []), *_notes(n)],
    lambda n, w: [_one_line(n, w)],
)


def nodes_text(nodes: Sequence[Node], width: int = 36, height: int = 8) -> Text:
    """Every node's block at the most detail that fits ``height`` lines; lines are cut at ``width``."""
    height = max(height, 1)
    lines: list[Text] = []
    for level in _LEVELS:
        lines = [line for node in nodes for line in level(node, width)]
        if len(lines) <= height:
            break
    else:
        shown = height - 1
        lines = lines[:shown] + [Text(f"+{len(nodes) - shown} more hosts", style="dim")]
    for line in lines:
        line.truncate(max(width, 1), overflow="ellipsis")
    return Text("\n").join(lines)


def telemetry_text(sample: TelemetrySample | None, width: int = 36, height: int = 8) -> Text:
    """The monitor's own machine (its sample from :class:`~dagtop.io.telemetry.TelemetrySampler`)."""
    if sample is None:
        return Text("sampling…", style="dim")
    return nodes_text(monitor_nodes(sample), width, height)


def panel_text(job: Sequence[wire.Telemetry], sample: TelemetrySample | None, *, live: bool, width: int = 36,
               height: int = 8) -> Text:
    """The job's hosts when its ranks send telemetry; else the monitor's machine, if sampled (live); else why not."""
    if job:
        return nodes_text(job_nodes(job), width, height)
    if sample is not None:
        return telemetry_text(sample, width, height)
    if live:
        return Text("waiting for the ranks' telemetry…", style="dim")
    why = "no telemetry from the job yet (recordings made by a shim older than the telemetry frame have none)"
    if len(why) > width * height * 3 // 4:  # wrapped on words, a line's end goes unused
        why = "no telemetry from the job yet"
    return Text(why, style="dim")


def panel_title(job: Sequence[wire.Telemetry], sample: TelemetrySample | None, room: int | None = None) -> str:
    """Whose figures the panel shows: the job's hosts, or the monitor's own (then it says so); without the word
    "telemetry" where the title would not fit the ``room`` its border has."""
    if job:
        hosts = len({t.host for t in job})
        whose = f"job · {hosts} host{'s' if hosts > 1 else ''}"
    else:
        whose = "this host (monitor)" if sample is not None else "job"
    title = f"telemetry · {whose}"
    return whose if room is not None and len(title) > room else title
