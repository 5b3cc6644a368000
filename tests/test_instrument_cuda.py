"""The shim on a GPU: CUDA-event timing resolved on the publisher thread (skipped without CUDA; see issue #5)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn

import instrument
from instrument import wire

pytestmark = pytest.mark.cuda


def test_gpu_tasks_arrive_on_gpu_and_copy_lanes_in_cpu_clock(collector: Any, endpoint: str) -> None:
    device = torch.device("cuda", 0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True), nn.Flatten(),
                          nn.Linear(16 * 32 * 32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    before = time.perf_counter_ns()
    batches = [(torch.randn(64, 3, 32, 32).pin_memory(), torch.randint(10, (64,))) for _ in range(5)]
    for x, y in tracer.loader(batches):
        x, y = tracer.to_device((x, y), device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    after = time.perf_counter_ns()
    tracer.close()
    iterations = [f for f in map(lambda r: wire.decode(r.payload), collector.until_bye())
                  if isinstance(f, wire.IterationBatch)]
    assert len(iterations) == 5
    for batch in iterations:
        lanes = {(e.phase, e.lane) for e in batch.events}
        assert {("forward", "gpu"), ("backward", "gpu"), ("update", "gpu"), ("h2d", "copy"), ("load", "main")} <= lanes
        for e in batch.events:
            assert before <= e.start_ns <= e.end_ns <= after + 5_000_000, e  # converted to the CPU clock
        gpu = sorted((e for e in batch.events if e.lane == "gpu"), key=lambda e: e.start_ns)
        for a, b in zip(gpu, gpu[1:]):
            assert a.end_ns <= b.start_ns + 20_000, (a, b)  # one stream: program order, within clock error


def _frames(collector: Any) -> list[wire.IterationBatch]:
    return [f for f in map(lambda r: wire.decode(r.payload), collector.until_bye())
            if isinstance(f, wire.IterationBatch)]


def test_a_cuda_graph_capture_succeeds_with_the_shim_attached(collector: Any, endpoint: str) -> None:
    """Capture (global mode) lasts long enough for the publisher thread to poll and calibrate during it."""
    device = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(64, 256, device=device)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = model(x).square().mean()
        loss.backward()
        time.sleep(1.5)
        optimizer.step()
    losses = []
    for _ in range(5):
        graph.replay()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert tracer.enabled
    tracer.close()
    assert len(_frames(collector)) >= 3  # the eager warm-up iterations were timed


def test_a_compiled_model_is_timed_from_outside_the_graph(collector: Any, endpoint: str) -> None:
    from torch._dynamo.utils import counters

    device = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.01)
    tracer = instrument.attach(compiled, optimizer, endpoint=endpoint)
    collector.joined()
    counters.clear()
    for _ in range(4):
        loss = compiled(torch.randn(32, 64, device=device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
    tracer.close()
    batches = _frames(collector)
    assert len(batches) == 4
    for batch in batches[1:]:
        assert {(e.phase, e.name) for e in batch.events if e.lane == "gpu"} >= {
            ("forward", "Sequential"), ("backward", "Sequential"), ("update", "optimizer.step")}


def test_nccl_bucket_all_reduces_are_timed_on_the_gpu(collector: Any, endpoint: str) -> None:
    import torch.distributed as dist

    from dagtop.demo.launch import free_port

    device = torch.device("cuda", 0)
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)]).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=1)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        tracer = instrument.attach(ddp, optimizer, endpoint=endpoint)
        collector.joined()
        for _ in range(5):
            loss = ddp(torch.randn(64, 512, device=device)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        tracer.close()
    finally:
        dist.destroy_process_group()
    batches = _frames(collector)
    assert len(batches) == 5
    for batch in batches[2:]:  # buckets are rebuilt after iteration 0
        comm = [e for e in batch.events if e.phase == "allreduce"]
        update = next(e for e in batch.events if e.phase == "update")
        backward = [e for e in batch.events if e.phase == "backward"]
        assert len(comm) >= 4 and all(e.lane == "comm" and e.bytes > 0 for e in comm)
        # On the GPU clock: a bucket is ready inside the backward and done before the update starts.
        assert all(min(b.start_ns for b in backward) <= e.start_ns <= e.end_ns <= update.start_ns + 20_000
                   for e in comm), comm
