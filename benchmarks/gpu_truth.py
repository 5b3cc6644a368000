"""dagtop on a real GPU, checked against the profiler: accuracy, overhead, PCIe, NVML, CUDA graphs (issue #16),
and collectives, straggler and what-if (issue #17, ``--part 2``).

Usage (on a machine with an NVIDIA GPU; the repo root on PYTHONPATH):

    python benchmarks/gpu_truth.py --out DIR [--part 1|2|all] [--quick]

Prints one table per check and writes every figure to DIR/gpu_truth.json. Every dagtop figure is compared
with one taken without dagtop's timing code: torch.profiler's kernel timeline (blocks attributed by the
checks' own record_function ranges and autograd sequence numbers, see kineto_truth.py), plain runs for
overhead, and re-runs for the what-if.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kineto_truth
from gpu_common import DEV, Collector, dagtop_cli, median, report, say
from gpu_models import check_model, gpt2_job, resnet50_job

import instrument
from dagtop.demo.launch import free_endpoint

RESULTS: dict[str, Any] = {}


def pcie(out: Path, quick: bool) -> dict[str, Any]:
    """Host-to-device copies through tracer.to_device against the profiler's memcpy, pinned and pageable."""
    say("\n== PCIe: host-to-device copies, dagtop (events around the copy) against the profiler's memcpy")
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
    width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
    per_lane = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}.get(gen, float("nan"))
    nominal = per_lane * width
    say(f"  link: PCIe gen {gen} x{width}, nominal {nominal:.1f} GB/s per direction "
        f"(current gen {pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)} x{pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)})")
    tiny = nn.Linear(8, 8).to(DEV)
    opt = torch.optim.SGD(tiny.parameters(), lr=0.1)
    endpoint = free_endpoint()
    collector = Collector(endpoint)
    tracer = instrument.attach(tiny, opt, endpoint=endpoint)
    time.sleep(0.3)
    sizes_mb = [1, 4, 16, 64, 256] if quick else [1, 4, 16, 64, 256, 1024]
    hosts = {}
    for kind in ("pinned", "pageable"):
        for mb in sizes_mb:
            host = torch.empty(mb * 2**20 // 4).fill_(1.5)
            hosts[kind, mb] = host.pin_memory() if kind == "pinned" else host
    plan: list[tuple[int, str, int, int, bool]] = []
    counter = itertools.count()

    def copies(profiled: bool) -> None:
        for (kind, mb), host in hosts.items():
            for rep in range(6):
                it = next(counter)
                with kineto_truth.iteration(it):
                    x = tracer.to_device(host, DEV)
                    opt.step()
                plan.append((it, kind, mb, rep, profiled))
                del x
            torch.cuda.synchronize()

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        copies(True)
    copies(False)  # the same copies with no profiler slowing the host down
    wall: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (kind, mb), host in hosts.items():  # the copy with no dagtop at all, host clock around it
        for rep in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            host.to(DEV, non_blocking=True)
            torch.cuda.synchronize()
            if rep:
                wall[kind, mb].append(host.numel() * 4 / (time.perf_counter_ns() - t0))
    path = out / "trace-pcie.json"
    prof.export_chrome_trace(str(path))
    time.sleep(0.5)
    tracer.close()
    time.sleep(0.3)
    frames = collector.iterations()
    truth = kineto_truth.read(str(path))
    path.unlink()
    memcpy = {m["iteration"]: m for m in truth.memcpy if m["iteration"] is not None}
    rows = []
    say("  kind        size   dagtop (profiled)  profiler memcpy  dagtop (no profiler)  plain copy, host clock")
    for kind, mb in hosts:
        d, p, u = [], [], []
        for (i, k, m, rep, profiled) in plan:
            if k != kind or m != mb or rep == 0:
                continue
            ev = [e for e in frames.get((0, i), []) if e.phase == "h2d"]
            if not ev:
                continue
            gbs = ev[0].bytes / ev[0].duration_ns  # bytes per ns = GB/s
            if not profiled:
                u.append(gbs)
            elif i in memcpy:
                d.append(gbs)
                p.append(memcpy[i]["bytes"] / (memcpy[i]["dur"] * 1e3))
        row = {"kind": kind, "MB": mb, "dagtop_GBs": median(d), "profiler_GBs": median(p),
               "dagtop_unprofiled_GBs": median(u), "plain_wall_GBs": median(wall[kind, mb]),
               "err": abs(median(d) - median(p)) / median(p) if p else float("nan")}
        rows.append(row)
        say(f"  {kind:<9} {mb:>5} MB  {row['dagtop_GBs']:7.2f} GB/s       {row['profiler_GBs']:7.2f} GB/s "
            f"({row['err']:5.1%})  {row['dagtop_unprofiled_GBs']:7.2f} GB/s ({row['dagtop_unprofiled_GBs'] / nominal:4.0%} "
            f"of nominal)   {row['plain_wall_GBs']:7.2f} GB/s")
    return {"gen": gen, "width": width, "nominal_GBs": nominal, "rows": rows}


def pcie_demo(out: Path) -> dict[str, Any]:
    say("\n== dagtop demo --device cuda --bottleneck pcie (1 rank)")
    path = out / "pcie.dagtop"
    done = dagtop_cli("demo", "--device", "cuda", "--ranks", "1", "--bottleneck", "pcie", "--iterations", "40",
                      "--record", str(path))
    if done.returncode != 0:
        say(done.stdout[-2000:], done.stderr[-2000:])
        return {"error": done.stderr[-500:]}
    r = report(path)
    say(f"  bottleneck {r['bottleneck']}; critical path {r['critical_path']}; iteration {r['iteration_ms']}")
    return {"bottleneck": r["bottleneck"], "critical_path": r["critical_path"], "iteration_ms": r["iteration_ms"]}


def nvml_panel() -> dict[str, Any]:
    say("\n== NVML telemetry under load (copies and matrix products), as the telemetry panel draws it")
    from dagtop.io.telemetry import TelemetrySampler
    from dagtop.ui.renderables.telemetry import telemetry_text

    stop = threading.Event()

    def load() -> None:
        host = torch.empty(64 * 2**20).pin_memory()
        a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
        while not stop.is_set():
            host.to(DEV, non_blocking=True)
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    worker = threading.Thread(target=load)
    worker.start()
    sampler = TelemetrySampler()
    sampler()
    time.sleep(2.0)
    sample = sampler()
    # What a rank itself sends (instrument/telemetry.py): its own GPU found by UUID, and what a sample costs the
    # sampling thread (NVML's PCIe readings take 20 ms each, with the GIL released).
    from instrument.telemetry import GpuProbe

    probe = GpuProbe(torch.cuda.current_device())
    note = probe.start()
    started = time.perf_counter()
    cpu_started = time.thread_time()
    own = probe.sample()
    took_ms, cpu_ms = (time.perf_counter() - started) * 1e3, (time.thread_time() - cpu_started) * 1e3
    probe.close()
    stop.set()
    worker.join()
    sampler.close()
    text = telemetry_text(sample).plain
    say(text)
    say(f"  the rank's own probe: {note or own} · {took_ms:.1f} ms wall, {cpu_ms:.2f} ms CPU on its thread")
    g = sample.gpus[0] if sample.gpus else None
    return {"text": text, "gpu": None if g is None else {k: getattr(g, k) for k in g.__slots__},
            "rank_probe": {"note": note, "index": probe.index, "name": probe.name, "wall_ms": took_ms,
                           "cpu_ms": cpu_ms, "util_percent": own.util_percent if own else None}}


def cuda_graph_capture(relaxed: bool) -> dict[str, Any]:
    """Capture fwd+bwd+step in a CUDA graph (global capture mode) while the shim runs; replay it."""
    from instrument import cuda as icuda

    model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(24)]).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    x = torch.randn(256, 1024, device=DEV)
    saved = icuda.CudaTiming.enter_thread
    if not relaxed:
        icuda.CudaTiming.enter_thread = lambda self: None  # type: ignore[method-assign]
    endpoint = free_endpoint()
    collector = Collector(endpoint)
    tracer = instrument.attach(model, opt, endpoint=endpoint)
    time.sleep(0.3)
    result: dict[str, Any] = {"relaxed": relaxed}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss = model(x).square().mean()
            loss.backward()
            time.sleep(1.5)  # long enough for the publisher thread to poll and calibrate during the capture
            opt.step()
        losses = []
        for _ in range(10):
            graph.replay()
            losses.append(float(loss))
        result.update(captured=True, loss_falls=losses[-1] < losses[0], shim_enabled=tracer.enabled)
    except Exception as exc:  # noqa: BLE001
        result.update(captured=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        icuda.CudaTiming.enter_thread = saved  # type: ignore[method-assign]
        with contextlib.suppress(Exception):
            tracer.close()
        collector.iterations()
    return result


def run_pytest() -> dict[str, Any]:
    say("\n== CUDA-marked tests")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/"],
                          capture_output=True, text=True, timeout=400, check=False)
    tail = done.stdout.strip().splitlines()[-15:]
    say("\n".join(tail))
    return {"rc": done.returncode, "tail": tail}


# ---------------------------------------------------------------------------------------------- main


def part1(out: Path, quick: bool, only: set[str], rounds: int, steps: int) -> None:
    name = torch.cuda.get_device_name(0)
    RESULTS["device"] = {"name": name, "torch": torch.__version__, "cuda": torch.version.cuda}
    say(f"device {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    if not only or "capture" in only:
        say("\n== CUDA graph capture (global mode) with the shim attached, each in a fresh process")
        RESULTS["capture"] = []
        for relaxed in ("1", "0"):
            done = subprocess.run([sys.executable, __file__, "--capture-worker", relaxed], capture_output=True,
                                  text=True, timeout=120, check=False)
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
            RESULTS["capture"].append(line)
            say(f"  publisher thread in relaxed capture mode={relaxed}: {line}")
        save(out)
    if not only or "nvml" in only:
        RESULTS["nvml"] = nvml_panel()
        save(out)
    if not only or "pcie" in only:
        RESULTS["pcie"] = pcie(out, quick)
        RESULTS["pcie_demo"] = pcie_demo(out)
        save(out)
    if not only or "models" in only or "overhead" in only:
        rows = []
        for make in (resnet50_job, gpt2_job):
            if "resnet" in only and make is gpt2_job:
                continue
            job = make(quick)
            rows += check_model(job, out, rounds, steps, compile_too="compile" in only or not only,
                                ablations_only="overhead" in only)
            RESULTS["models"] = rows
            save(out)
            del job
            torch.cuda.empty_cache()
        RESULTS["models"] = rows
        say("\n| model | compile | granularity | plain ms/step | overhead (IQR) | worst block err (≥100 µs) "
            "| busy-weighted block err | iteration err | syncs added |")
        say("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            added = {k: v - r.get("syncs_plain", {}).get(k, 0) for k, v in r.get("syncs_instrumented", {}).items()}
            say(f"| {r['model']} | {'yes' if r['compile'] else 'no'} | {r['granularity']} | {r['plain_ms']:.2f} | "
                f"{r['overhead']:+.2%} ({r['iqr'][0]:+.2%}..{r['iqr'][1]:+.2%}) | {r['worst_block_err']:.1%} "
                f"({r['worst_block_err_over_100us']:.1%}) | {r['busy_weighted_err']:.1%} | {r['iteration_err']:.2%} | "
                f"{added or 'none'} |")
    if not only or "pytest" in only:
        RESULTS["pytest"] = run_pytest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--part", choices=("1", "2", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="smaller batches, fewer rounds")
    parser.add_argument("--rounds", type=int, default=7, help="overhead: interleaved rounds")
    parser.add_argument("--steps", type=int, default=20, help="overhead: timed steps per mode and round")
    parser.add_argument("--capture-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma-separated sections: capture,nvml,pcie,models,pytest,"
                        "nccl,gloo,straggler")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_truth: needs a CUDA device", file=sys.stderr)
        return 2
    if args.capture_worker is not None:
        print(json.dumps(cuda_graph_capture(args.capture_worker == "1")))
        return 0
    only = {s for s in args.only.split(",") if s}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if args.part in ("1", "all"):
            part1(out, args.quick, only, args.rounds, args.steps)
        if args.part in ("2", "all"):
            import gpu_collectives

            gpu_collectives.part2(out, args.quick, only, RESULTS)
    finally:
        save(out)
    return 0


def save(out: Path) -> None:
    (out / "gpu_truth.json").write_text(json.dumps(RESULTS, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
