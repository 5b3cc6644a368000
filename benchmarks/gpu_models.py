"""The two single-GPU jobs of gpu_truth.py (ResNet-50, GPT-2 small), their accuracy against the profiler, and
what dagtop costs them (interleaved paired rounds, with ablations that say where the cost comes from)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import kineto_truth
import torch
import torch.nn.functional as F
from gpu_common import DEV, Collector, drain_monitor, iqr, median, say
from torch import nn

import instrument
from dagtop.demo.launch import free_endpoint
from instrument import wire
from instrument.units import block_units, layer_units


class Job:
    """A single-GPU training job with pinned host batches and bf16 autocast; ``step(tracer)`` runs one step."""

    def __init__(self, name: str, model: nn.Module, batch: Any, loss: Any, quick: bool) -> None:
        self.name, self.model, self.host_batch, self._loss = name, model, batch, loss
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.quick = quick

    def step(self, tracer: Any = None) -> None:
        if tracer is not None:
            batch = tracer.to_device(self.host_batch, DEV)
        else:
            batch = tuple(t.to(DEV, non_blocking=True) for t in self.host_batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self._loss(self.model, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def resnet50_job(quick: bool) -> Job:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(DEV)
    b = 64 if quick else 128
    batch = (torch.randn(b, 3, 224, 224).pin_memory(), torch.randint(1000, (b,)).pin_memory())
    return Job("ResNet-50", model, batch, lambda m, xy: F.cross_entropy(m(xy[0]), xy[1]), quick)


def gpt2_job(quick: bool) -> Job:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).to(DEV)  # GPT-2 small: 124 M parameters, from its config
    b, t = (8, 512) if quick else (16, 1024)
    ids = torch.randint(50257, (b, t)).pin_memory()
    return Job("GPT-2 small", model, (ids,), lambda m, ids: m(input_ids=ids[0], labels=ids[0]).loss, quick)


# ---------------------------------------------------------------------------------------------- accuracy


def profiled_run(job: Job, model: nn.Module, granularity: str | None, out: Path, tag: str,
                 warm: int = 6, iters: int = 8) -> tuple[kineto_truth.TraceTruth, dict[tuple[int, int], list[wire.Event]]]:
    """Run ``warm`` then ``iters`` profiled steps; dagtop attached unless granularity is None."""
    endpoint = free_endpoint()
    collector = Collector(endpoint)
    tracer = None
    if granularity is not None:
        tracer = instrument.attach(model, job.optimizer, endpoint=endpoint, granularity=granularity)
        assert tracer.enabled, "attach failed"
    time.sleep(0.3)
    for _ in range(warm):
        job.step(tracer)
    units = (layer_units if granularity == "layer" else block_units)(model)
    truth_hooks = kineto_truth.TruthHooks(units)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(warm, warm + iters):
            with kineto_truth.iteration(i):
                job.step(tracer)
        torch.cuda.synchronize()
    truth_hooks.remove()
    path = out / f"trace-{tag}.json"
    prof.export_chrome_trace(str(path))
    time.sleep(0.5)
    if tracer is not None:
        assert tracer.enabled, f"{tag}: the shim disabled itself"
        tracer.close()
    time.sleep(0.3)
    frames = collector.iterations()
    truth = kineto_truth.read(str(path))
    path.unlink()
    return truth, frames


def compare_blocks(truth: kineto_truth.TraceTruth, frames: dict[tuple[int, int], list[wire.Event]],
                   iterations: range) -> dict[str, Any]:
    """Per block and phase: dagtop's span against the profiler's GPU busy time (and span) of that block."""
    per: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    missing = 0
    for it in iterations:
        events = frames.get((0, it), [])
        for e in events:
            if e.phase not in ("forward", "backward") or e.lane != "gpu":
                continue
            span = truth.blocks.get((it, e.name, e.phase))
            if span is None:
                missing += 1
                continue
            per[(e.name, e.phase)].append((e.duration_ns / 1e3, span.busy, span.end - span.start))
    rows = []
    for (name, phase), xs in per.items():
        d = median([x[0] for x in xs])
        busy = median([x[1] for x in xs])
        span = median([x[2] for x in xs])
        err_busy = median([abs(x[0] - x[1]) / x[1] for x in xs if x[1] > 0])
        err_span = median([abs(x[0] - x[2]) / x[2] for x in xs if x[2] > 0])
        rows.append({"block": name, "phase": phase, "dagtop_us": d, "busy_us": busy, "span_us": span,
                     "err_busy": err_busy, "err_span": err_span})
    # Per iteration: update end to update end, against the end of the last GPU operation of each iteration.
    ends = {}
    for it in iterations:
        up = [e for e in frames.get((0, it), []) if e.phase == "update"]
        if up:
            ends[it] = up[0].end_ns / 1e3
    it_err = []
    for it in iterations:
        if it - 1 in ends and it in ends and it - 1 in truth.iteration_gpu_end and it in truth.iteration_gpu_end:
            d = ends[it] - ends[it - 1]
            p = truth.iteration_gpu_end[it] - truth.iteration_gpu_end[it - 1]
            it_err.append((d, p, abs(d - p) / p))
    busy_share = []
    for it in iterations:
        if it - 1 in truth.iteration_gpu_end and it in truth.iteration_gpu_end:
            busy = sum(g["dur"] for g in truth.gpu_ops if g["iteration"] == it)
            busy_share.append(busy / (truth.iteration_gpu_end[it] - truth.iteration_gpu_end[it - 1]))
    total_busy = sum(r["busy_us"] for r in rows) or 1.0
    weighted = sum(r["err_busy"] * r["busy_us"] for r in rows) / total_busy
    return {
        "blocks": rows,
        "unmatched_events": missing,
        "worst_block_err": max((r["err_busy"] for r in rows), default=float("nan")),
        "worst_block_err_over_100us": max((r["err_busy"] for r in rows if r["busy_us"] >= 100),
                                          default=float("nan")),
        "blocks_within_10pct": sum(r["err_busy"] <= 0.10 for r in rows),
        "busy_weighted_err": weighted,
        "iteration_ms": median([x[0] / 1e3 for x in it_err]),
        "iteration_err": median([x[2] for x in it_err]),
        "iteration_err_max": max((x[2] for x in it_err), default=float("nan")),
        "gpu_busy_share": median(busy_share),
        "events_per_iteration": median([len(frames.get((0, it), [])) for it in iterations]),
    }


def accuracy(job: Job, model: nn.Module, granularity: str, out: Path, tag: str) -> dict[str, Any]:
    truth, frames = profiled_run(job, model, granularity, out, tag)
    result = compare_blocks(truth, frames, range(6, 14))
    result["syncs_instrumented"] = dict(truth.syncs)
    say(f"  {tag}: {len(result['blocks'])} units, worst block err {result['worst_block_err']:.1%} "
        f"(units ≥100 µs: {result['worst_block_err_over_100us']:.1%}), busy-weighted {result['busy_weighted_err']:.1%}, "
        f"{result['blocks_within_10pct']}/{len(result['blocks'])} within 10 %, iteration {result['iteration_ms']:.2f} ms "
        f"err {result['iteration_err']:.2%} (max {result['iteration_err_max']:.2%}), syncs {dict(truth.syncs)}")
    shown = result["blocks"] if granularity == "block" else sorted(result["blocks"], key=lambda r: -r["err_busy"])[:4]
    say(f"      GPU busy {result['gpu_busy_share']:.0%} of the profiled iterations")
    for r in shown:
        say(f"      {r['block']:<28} {r['phase']:<8} dagtop {r['dagtop_us']:8.1f} µs  kernels {r['busy_us']:8.1f} µs"
            f"  span {r['span_us']:8.1f} µs  err {r['err_busy']:.1%} / span {r['err_span']:.1%}")
    return result


def plain_syncs(job: Job, model: nn.Module, out: Path, tag: str) -> dict[str, int]:
    truth, _ = profiled_run(job, model, None, out, tag, warm=3, iters=4)
    return dict(truth.syncs)


# ---------------------------------------------------------------------------------------------- overhead


def overhead(job: Job, model: nn.Module, modes: list[str], rounds: int, steps: int) -> dict[str, Any]:
    """Interleaved rounds, rotated order; per round each mode's ms/step; paired ratios against plain."""
    endpoint = free_endpoint()
    times: dict[str, list[float]] = {m: [] for m in modes}
    with drain_monitor(endpoint):
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                tracer = _tracer_for(mode, model, job, endpoint)
                for _ in range(3):
                    job.step(tracer)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    job.step(tracer)
                torch.cuda.synchronize()
                times[mode].append((time.perf_counter() - t0) / steps * 1e3)
                if tracer is not None:
                    assert getattr(tracer, "enabled", True)
                    tracer.close()
    out: dict[str, Any] = {"ms": {m: median(v) for m, v in times.items()}, "raw": times}
    for m in modes:
        if m != "plain":
            ratios = [a / b - 1 for a, b in zip(times[m], times["plain"])]
            out[m] = {"overhead": median(ratios), "iqr": iqr(ratios)}
    return out


class _CopyOnly:
    """Ablation: dagtop's timed ``to_device`` alone, no hooks and no publisher."""

    def __init__(self) -> None:
        from instrument.cuda import CudaTiming

        self._timing = CudaTiming(DEV, pool_events=64)

    def to_device(self, batch: Any, device: Any) -> Any:
        from instrument.cuda import move_timed

        out, _, start, end = move_timed(self._timing, batch, DEV)
        self._timing._free.extend(s for s in (start, end) if s is not None)
        return out

    def close(self) -> None:
        pass


class _HooksOnly:
    """Ablation: dagtop attached, but the batch copied as the plain run copies it."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self.enabled = tracer.enabled

    def to_device(self, batch: Any, device: Any) -> Any:
        return tuple(t.to(device, non_blocking=True) for t in batch)

    def close(self) -> None:
        self._tracer.close()


def _skip_resolution(tracer: Any) -> None:
    """Ablation: the publisher sends empty iterations instead of resolving the events (stamps recycled)."""
    timing = tracer._cuda

    def resolve(events: Any) -> list[Any]:
        timing._free.extend({id(s): s for ev in events for s in ev[4:6] if s is not None}.values())
        return []

    timing.ready = lambda events: True
    timing.resolve = resolve


class _CopyStream:
    """Ablation: dagtop attached, the batch copied on a dedicated copy stream that the compute stream waits for
    (what the shim did before it timed copies on the training stream)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self.enabled = tracer.enabled
        self._stream = torch.cuda.Stream(DEV)

    def to_device(self, batch: Any, device: Any) -> Any:
        from instrument.batch import map_tensors

        timing = self._tracer._cuda
        pairs: list[Any] = []

        def empty_like(tensor: torch.Tensor) -> torch.Tensor:
            pairs.append((torch.empty_like(tensor, device=DEV), tensor))
            return pairs[-1][0]

        out = map_tensors(batch, empty_like)
        current = torch.cuda.current_stream(DEV)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            start = timing.stamp()
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            end = timing.stamp()
        current.wait_stream(self._stream)
        self._tracer._events.append(("pcie", "h2d", "to_device", "copy", start, end,
                                     sum(s.numel() * s.element_size() for _, s in pairs)))
        return out

    def close(self) -> None:
        self._tracer.close()


def _tracer_for(mode: str, model: nn.Module, job: Job, endpoint: str) -> Any:
    if mode == "plain":
        return None
    if mode == "copy-only":
        return _CopyOnly()
    tracer = instrument.attach(model, job.optimizer, endpoint=endpoint,
                               granularity="layer" if mode == "layer" else "block")
    if mode == "no-resolve":
        _skip_resolution(tracer)
    if mode == "copy-stream":
        return _CopyStream(tracer)
    return _HooksOnly(tracer) if mode == "hooks-only" else tracer


# ---------------------------------------------------------------------------------------------- checks


def check_model(job: Job, out: Path, rounds: int, steps: int, compile_too: bool,
                ablations_only: bool = False) -> list[dict[str, Any]]:
    """Accuracy and overhead of one job, eager then compiled; with ``ablations_only``, where the cost comes from."""
    rows = []
    if ablations_only:  # no profiler
        ablations = ["plain", "block", "copy-stream", "hooks-only"]
        ov = overhead(job, job.model, ablations, rounds, steps)
        for m in ablations[1:]:
            say(f"  {job.name} {m:<11} overhead {ov[m]['overhead']:+.2%} (IQR {ov[m]['iqr'][0]:+.2%}..{ov[m]['iqr'][1]:+.2%})")
        if compile_too:
            cjob = _CompiledJob(job, torch.compile(job.model))
            for _ in range(3):
                cjob.step()
            ov = overhead(cjob, cjob.model, ablations, rounds, steps)
            for m in ablations[1:]:
                say(f"  {job.name} compiled {m:<11} overhead {ov[m]['overhead']:+.2%} "
                    f"(IQR {ov[m]['iqr'][0]:+.2%}..{ov[m]['iqr'][1]:+.2%})")
        return rows
    say(f"\n== {job.name}: accuracy against the profiler, eager")
    eager = {g: accuracy(job, job.model, g, out, f"{job.name}-eager-{g}") for g in ("block", "layer")}
    syncs_plain = plain_syncs(job, job.model, out, f"{job.name}-plain")
    say(f"  plain run syncs: {syncs_plain}")
    say(f"== {job.name}: overhead, eager ({rounds} rounds x {steps} steps)")
    modes = ["plain", "block", "layer"]
    ov = overhead(job, job.model, modes, rounds, steps)
    say(f"  ms/step {ov['ms']}")
    for m in modes[1:]:
        say(f"  {m:<10} overhead {ov[m]['overhead']:+.2%} (IQR {ov[m]['iqr'][0]:+.2%}..{ov[m]['iqr'][1]:+.2%})")
    for g in ("block", "layer"):
        rows.append({"model": job.name, "compile": False, "granularity": g, "plain_ms": ov["ms"]["plain"],
                     "ms": ov["ms"][g], **ov[g], **{k: v for k, v in eager[g].items() if k != "blocks"},
                     "syncs_plain": syncs_plain, "blocks": eager[g]["blocks"]})
    if not compile_too:
        return rows
    say(f"\n== {job.name}: torch.compile")
    compiled = torch.compile(job.model)
    cjob = _CompiledJob(job, compiled)
    t0 = time.perf_counter()
    for _ in range(3):
        cjob.step()
    torch.cuda.synchronize()
    say(f"  compiled in {time.perf_counter() - t0:.1f} s")
    from torch._dynamo.utils import counters

    graphs_before = counters["stats"]["unique_graphs"]
    breaks_before = sum(counters["graph_break"].values())
    acc = accuracy(cjob, compiled, "block", out, f"{job.name}-compiled")
    ov = overhead(cjob, compiled, ["plain", "block"], rounds, steps)
    graphs_after = counters["stats"]["unique_graphs"]
    breaks_after = sum(counters["graph_break"].values())
    say(f"  ms/step {ov['ms']}; block {ov['block']}; new graphs with dagtop {graphs_after - graphs_before}, "
        f"new graph breaks {breaks_after - breaks_before}")
    rows.append({"model": job.name, "compile": True, "granularity": "block (one compiled unit)",
                 "plain_ms": ov["ms"]["plain"], "ms": ov["ms"]["block"], **ov["block"],
                 **{k: v for k, v in acc.items() if k != "blocks"}, "blocks": acc["blocks"],
                 "new_graphs": graphs_after - graphs_before, "new_graph_breaks": breaks_after - breaks_before})
    return rows


class _CompiledJob(Job):
    """The same job, stepping through the compiled module."""

    def __init__(self, job: Job, compiled: nn.Module) -> None:
        self.__dict__.update(job.__dict__)
        self.model = compiled
