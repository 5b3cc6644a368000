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
    time.sleep(0.3)
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
    time.sleep(0.3)
    iterations = [f for f in map(lambda r: wire.decode(r.payload), collector.stop())
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
