"""Part 2 of gpu_truth.py (issue #17): every bucket's all-reduce on a GPU against the profiler, a real GPU
straggler, and the what-if "straggler at median" against a re-run without it.

Run through ``python benchmarks/gpu_truth.py --part 2 --out DIR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kineto_truth
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gpu_common import Collector, dagtop_cli, median, report, say

import instrument
from dagtop.demo.launch import free_endpoint, free_port
from instrument import wire

WARM, ITERS = 6, 8


def _job(arch: str, batch: int) -> tuple[torch.nn.Module, Any]:
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=1000).cuda()
    data = (torch.randn(batch, 3, 224, 224).pin_memory(), torch.randint(1000, (batch,)).pin_memory())
    return model, data


def _train(ddp: torch.nn.Module, data: Any, trace: Path, endpoint: str) -> None:
    """WARM steps, then ITERS profiled ones, each marked truth:iter#N; the trace goes to ``trace``."""
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    tracer = instrument.attach(ddp, optimizer, endpoint=endpoint)
    assert tracer.enabled
    time.sleep(0.3)

    def step() -> None:
        x, y = tracer.to_device(data, torch.device("cuda", 0))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(WARM):
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(WARM, WARM + ITERS):
            with kineto_truth.iteration(i):
                step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    time.sleep(0.5)
    assert tracer.enabled, "the shim disabled itself"
    tracer.close()


def _compare(truth: kineto_truth.TraceTruth, frames: dict[tuple[int, int], list[wire.Event]], rank: int,
             kind: str) -> list[dict[str, Any]]:
    """Per bucket: dagtop's ready and done against the collective's GPU work, both relative to the end of
    the iteration's last GPU operation (dagtop: the update's end), so no clock alignment is assumed."""
    rows: list[dict[str, Any]] = []
    for it in range(WARM, WARM + ITERS):
        events = frames.get((rank, it), [])
        update = [e for e in events if e.phase == "update"]
        if not update or it not in truth.iteration_gpu_end:
            continue
        anchor_d, anchor_p = update[0].end_ns / 1e3, truth.iteration_gpu_end[it]
        buckets = sorted((e for e in events if e.phase == "allreduce"), key=lambda e: e.start_ns)
        if kind == "nccl":
            ops = [dict(c, ts=c["end"], dur=0.0, name=c["op"]) for c in truth.collectives if c["iteration"] == it]
        else:  # gloo on CUDA tensors: the result comes back by a host-to-device copy from gloo's thread
            main_tids = {k["launch_tid"] for k in truth.gpu_ops if k["cat"] == "kernel" and k["iteration"] == it}
            ops = sorted((m for m in truth.memcpy if m["iteration"] == it and m["launch_tid"] not in main_tids),
                         key=lambda k: k["ts"])
        for b in buckets:
            match = next((o for o in ops if kind == "nccl" or o["bytes"] == b.bytes), None)
            if match is None:
                continue
            ops.remove(match)
            end_d, end_p = b.end_ns / 1e3 - anchor_d, match["ts"] + match["dur"] - anchor_p
            rows.append({"iteration": it, "rank": rank, "bucket": b.name, "bytes": b.bytes,
                         "dagtop_us": b.duration_ns / 1e3, "op_us": match["dur"], "end_error_us": end_d - end_p,
                         "op": match["name"][:40]})
    return rows


def _summary(rows: list[dict[str, Any]], label: str) -> dict[str, Any]:
    errs = [abs(r["end_error_us"]) for r in rows]
    out = {"label": label, "buckets": len(rows), "median_abs_end_error_us": median(errs),
           "median_end_error_us": median([r["end_error_us"] for r in rows]), "rows": rows,
           "max_abs_end_error_us": max(errs, default=float("nan")),
           "median_dagtop_us": median([r["dagtop_us"] for r in rows]),
           "median_op_us": median([r["op_us"] for r in rows])}
    say(f"  {label}: {len(rows)} bucket all-reduces matched; end vs profiler: median |err| "
        f"{out['median_abs_end_error_us']:.1f} µs, max {out['max_abs_end_error_us']:.1f} µs; dagtop ready→done "
        f"median {out['median_dagtop_us']:.0f} µs, the collective's own GPU op {out['median_op_us']:.0f} µs")
    for r in rows[:6]:
        say(f"      it {r['iteration']} r{r['rank']} {r['bucket']:<9} {r['bytes'] / 1e6:7.1f} MB  dagtop {r['dagtop_us']:8.0f} µs"
            f"  op {r['op_us']:8.0f} µs  end err {r['end_error_us']:+7.1f} µs  {r['op']}")
    return out


def nccl_world_1(out: Path) -> dict[str, Any]:
    say("\n== NCCL, world size 1: DDP ResNet-50 bucket all-reduces against the GPU work each one launched "
        "(ncclDevKernel_*; with one rank none, so the hook's division of the bucket)")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        model, data = _job("resnet50", 64)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        endpoint = free_endpoint()
        collector = Collector(endpoint)
        trace = out / "trace-nccl.json"
        _train(ddp, data, trace, endpoint)
        time.sleep(0.3)
        frames = collector.iterations()
        truth = kineto_truth.read(str(trace))
        trace.unlink()
        dagtop_buckets = [e for it in range(WARM, WARM + ITERS) for e in frames.get((0, it), []) if e.phase == "allreduce"]
        say(f"  dagtop: {len(dagtop_buckets)} bucket all-reduces in {ITERS} iterations; the profiler: "
            f"{len(truth.collectives)} c10d::allreduce_ calls, {len(truth.nccl)} NCCL kernels")
        result = _summary(_compare(truth, frames, 0, "nccl"), "NCCL ws=1")
        result.update(compile_ddp(data))
        return result
    finally:
        dist.destroy_process_group()


def compile_ddp(data: Any) -> dict[str, Any]:
    """torch.compile(DDP(model)): the buckets are still timed, and dagtop adds no graph break."""
    from torch._dynamo.utils import counters

    x, y = data[0][:32].cuda(), data[1][:32].cuda()
    result: dict[str, Any] = {}
    for attached in (False, True):
        torch._dynamo.reset()
        counters.clear()
        model, _ = _job("resnet18", 32)
        compiled = torch.compile(torch.nn.parallel.DistributedDataParallel(model, device_ids=[0]))
        optimizer = torch.optim.AdamW(compiled.parameters(), lr=1e-4)
        endpoint = free_endpoint()
        collector = Collector(endpoint)
        tracer = instrument.attach(compiled, optimizer, endpoint=endpoint) if attached else None
        for _ in range(6):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(compiled(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        time.sleep(0.5)
        if tracer is not None:
            tracer.close()
        time.sleep(0.3)
        frames = collector.iterations()
        breaks = sum(counters["graph_break"].values())
        graphs = counters["stats"]["unique_graphs"]
        if not attached:
            result.update(compile_ddp_plain_graph_breaks=breaks, compile_ddp_plain_graphs=graphs)
            continue
        per_it = [sum(e.phase == "allreduce" for e in frames.get((0, i), [])) for i in range(2, 6)]
        units = sorted({e.name for i in range(2, 6) for e in frames.get((0, i), []) if e.phase == "forward"})
        result.update(compile_ddp_allreduces=per_it, compile_ddp_units=units, compile_ddp_graph_breaks=breaks,
                      compile_ddp_graphs=graphs)
    say(f"  torch.compile(DDP(resnet18)): {result}")
    return result


def worker(rank: int, world: int, out: Path) -> int:
    """One rank of the gloo-on-CUDA job (two ranks share the GPU): see gloo_shared_gpu."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, data = _job("resnet18", 32)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    _train(ddp, data, out / f"trace-gloo-{rank}.json", os.environ["DAGTOP_ENDPOINT"])
    dist.barrier()
    dist.destroy_process_group()
    return 0


def gloo_shared_gpu(out: Path) -> dict[str, Any]:
    say("\n== gloo on CUDA tensors, 2 ranks sharing the GPU: DDP ResNet-18 buckets against gloo's copies back")
    endpoint = free_endpoint()
    collector = Collector(endpoint)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   DAGTOP_ENDPOINT=endpoint)
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(rank), "2", str(out)], env=env))
    codes = [p.wait(timeout=300) for p in procs]
    time.sleep(0.3)
    frames = collector.iterations()
    if any(codes):
        say(f"  workers failed: {codes}")
        return {"error": codes}
    rows = []
    for rank in range(2):
        trace = out / f"trace-gloo-{rank}.json"
        rows += _compare(kineto_truth.read(str(trace)), frames, rank, "gloo")
        trace.unlink()
    return _summary(rows, "gloo-on-CUDA, 2 ranks")


def straggler(out: Path, quick: bool) -> dict[str, Any]:
    """Real slow ranks on the GPU: dagtop's verdict, and its what-if against a re-run without the slow rank."""
    say("\n== A real GPU straggler (2 ranks on the GPU, gloo): verdict and what-if against a re-run")
    iterations = "40" if quick else "80"
    base = out / "none.dagtop"
    done = dagtop_cli("demo", "--device", "cuda", "--ranks", "2", "--iterations", iterations, "--record", str(base))
    if done.returncode != 0:
        say(done.stderr[-1500:])
        return {"error": done.stderr[-500:]}
    measured = report(base)["iteration_ms"]["median"]
    say(f"  re-run without the slow rank (--bottleneck none): median iteration {measured:.2f} ms")
    results = {"rerun_ms": measured, "cases": []}
    for bottleneck in ("compute", "io"):
        path = out / f"straggler-{bottleneck}.dagtop"
        done = dagtop_cli("demo", "--device", "cuda", "--ranks", "2", "--bottleneck", bottleneck, "--straggler", "1",
                          "--iterations", iterations, "--record", str(path))
        if done.returncode != 0:
            say(done.stderr[-1500:])
            continue
        r = report(path)
        pred = next((w for w in r["what_if"] if w["change"] == "straggler at median"), None)
        case = {"slowed": f"rank 1, {bottleneck}", "straggler": r["straggler"], "bottleneck": r["bottleneck"],
                "iteration_ms": r["iteration_ms"]["median"],
                "predicted_ms": None if pred is None else pred["iteration_ms"]}
        if pred is not None:
            case["error"] = abs(pred["iteration_ms"] - measured) / measured
        results["cases"].append(case)
        say(f"  rank 1 slowed in {bottleneck}: verdict {r['straggler']}, bottleneck {r['bottleneck']}, "
            f"iteration {case['iteration_ms']:.2f} ms; straggler at median predicts "
            f"{case['predicted_ms']} ms, re-run {measured:.2f} ms, error {case.get('error', float('nan')):.1%}")
    return results


def part2(out: Path, quick: bool, only: set[str], results: dict[str, Any]) -> None:
    results.setdefault("device", {"name": torch.cuda.get_device_name(0), "torch": torch.__version__})
    if not only or "nccl" in only:
        results["nccl"] = nccl_world_1(out)
    if not only or "gloo" in only:
        results["gloo"] = gloo_shared_gpu(out)
    if not only or "straggler" in only:
        results["straggler"] = straggler(out, quick)


if __name__ == "__main__":
    # gloo_shared_gpu's ranks: --worker RANK WORLD OUT
    sys.exit(worker(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])))
