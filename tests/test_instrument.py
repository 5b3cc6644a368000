"""The shim in one process: what it times, how it names it, and that it never hurts training."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from typing import Any

import pytest
import torch
from helpers.threads import PUBLISHER, all_ended, shim_threads
from torch import nn

import instrument
from instrument import wire
from instrument.batch import move
from instrument.ranktracer import NullTracer
from instrument.tracer import Tracer

BLOCKS = ["stem", "body", "head"]
LEAVES = ["stem.0", "body.0", "body.1", "head.2"]
AROUND = {"Net", *BLOCKS}
"""The modules around the timed ones: their own work (the ReLUs, the pooling) is theirs (tests/test_spans.py)."""


def _units(batch: wire.IterationBatch, phase: str, units: list[str]) -> list[str]:
    """The names of ``phase``'s tasks of ``units``, in order; any other one must be of a module around them."""
    names = [e.name for e in sorted(batch.events, key=lambda e: e.start_ns) if e.phase == phase]
    assert set(names) - set(units) <= AROUND, names
    return [n for n in names if n in units]


class Net(nn.Module):
    """Three blocks; in-place ReLUs right after hooked modules (the case full backward hooks break on)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True))
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.head = nn.Sequential(nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


def _data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    prototypes = torch.randn(4, 3, 8, 8, generator=g)
    batches = []
    for _ in range(n):
        y = torch.randint(4, (16,), generator=g)
        batches.append((prototypes[y] + 0.5 * torch.randn(16, 3, 8, 8, generator=g), y))
    return batches


def _train(tracer: Any, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    losses = []
    for x, y in tracer.loader(_data(steps)):
        x, y = tracer.to_device((x, y), "cpu")
        with tracer.task("augment", "io"):
            x = x.flip(3)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _setup(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _iterations(frames: list[Any]) -> dict[int, wire.IterationBatch]:
    decoded = [wire.decode(f.payload) for f in frames]
    return {f.iteration: f for f in decoded if isinstance(f, wire.IterationBatch)}


def _run(collector: Any, endpoint: str, steps: int = 6, **options: Any) -> dict[int, wire.IterationBatch]:
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint, **options)
    assert isinstance(tracer, Tracer)
    collector.joined()  # ZeroMQ drops what is sent before the connection is up (slow joiner)
    _train(tracer, model, optimizer, steps)
    tracer.close()
    return _iterations(collector.until_bye())


def test_import_instrument_loads_no_torch_and_nothing_of_the_monitor() -> None:
    code = "import sys, instrument; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split())
    banned = {m for m in loaded if m.split(".")[0] in {"torch", "dagtop", "textual", "networkx", "psutil", "rich"}}
    assert not banned, sorted(banned)
    assert "instrument.wire" in loaded and "msgpack" in loaded


def test_every_iteration_has_the_conventional_events(collector: Any, endpoint: str) -> None:
    iterations = _run(collector, endpoint)
    assert sorted(iterations) == list(range(6))
    x, y = _data(1)[0]
    for it, batch in iterations.items():
        assert batch.rank == 0
        by_phase: dict[str, list[wire.Event]] = defaultdict(list)
        for e in batch.events:
            by_phase[e.phase].append(e)
        assert [(e.category, e.name, e.lane) for e in by_phase["load"]] == [("io", "next", "main")]
        assert [(e.category, e.name, e.lane, e.bytes) for e in by_phase["h2d"]] == [
            ("pcie", "to_device", "main", x.nbytes + y.nbytes)
        ]
        assert _units(batch, "forward", BLOCKS) == BLOCKS
        assert _units(batch, "backward", BLOCKS) == BLOCKS[::-1]
        assert [(e.category, e.name) for e in by_phase["update"]] == [("compute", "optimizer.step")]
        assert [(e.category, e.name) for e in by_phase["custom"]] == [("io", "augment")]
        assert not by_phase["allreduce"]  # not DDP: nothing to all-reduce


def test_tasks_on_the_main_lane_never_overlap_and_follow_program_order(collector: Any, endpoint: str) -> None:
    for batch in _run(collector, endpoint).values():
        main = sorted((e for e in batch.events if e.lane == "main"), key=lambda e: (e.start_ns, e.end_ns))
        for before, after in zip(main, main[1:]):
            assert before.end_ns <= after.start_ns, (before, after)
        order = [(e.phase, e.name) for e in main]
        assert order[:2] == [("load", "next"), ("h2d", "to_device")]
        assert _units(batch, "backward", BLOCKS) == BLOCKS[::-1]
        assert order[-1] == ("update", "optimizer.step")


def test_layer_granularity_times_leaves_with_parameters(collector: Any, endpoint: str) -> None:
    iterations = _run(collector, endpoint, steps=3, granularity="layer")
    for batch in iterations.values():
        assert _units(batch, "forward", LEAVES) == LEAVES
        assert _units(batch, "backward", LEAVES) == LEAVES[::-1]


def test_sampling_takes_layer_detail_one_iteration_in_k(collector: Any, endpoint: str) -> None:
    iterations = _run(collector, endpoint, steps=7, sample_every=3)
    for it, batch in iterations.items():
        detailed = it % 3 == 0
        assert _units(batch, "forward", LEAVES if detailed else BLOCKS) == (LEAVES if detailed else BLOCKS), it


def test_an_exception_in_a_hook_disables_the_shim_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    assert isinstance(tracer, Tracer)
    calls = {"n": 0}
    real = instrument.timing.grad_fns

    def flaky(value: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 10:
            raise RuntimeError("boom")
        return real(value)

    monkeypatch.setattr(instrument.timing, "grad_fns", flaky)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = _train(tracer, model, optimizer, 12)
    dagtop_warnings = [w for w in caught if "dagtop" in str(w.message)]
    assert len(dagtop_warnings) == 1 and "boom" in str(dagtop_warnings[0].message)
    assert not tracer.enabled
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert not optimizer._optimizer_step_post_hooks
    assert len(losses) == 12 and losses[-1] < losses[0] / 4  # training went on, and learned
    tracer.close()


def test_no_monitor_listening_is_harmless_and_close_is_quick_and_idempotent(endpoint: str) -> None:
    model, optimizer = _setup()
    before = shim_threads()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    started = shim_threads() - before
    assert PUBLISHER in {t.name for t in started}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = _train(tracer, model, optimizer, 5)
    start = time.monotonic()
    tracer.close()
    tracer.close()
    assert time.monotonic() - start < 30  # bounded (a loaded machine may take the whole timeout), not a hang
    assert all_ended(started)  # nothing to linger for: the shim's threads end
    assert len(losses) == 5


def test_disabled_by_environment_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGTOP_DISABLE", "1")
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer)
    assert isinstance(tracer, NullTracer)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    data = _data(2)
    assert tracer.loader(data) is data
    with tracer.task("anything", "io"):
        pass
    batch = {"x": torch.ones(2), "y": [torch.zeros(3)]}
    moved = tracer.to_device(batch, "cpu")
    assert moved["x"].equal(batch["x"]) and moved["y"][0].equal(batch["y"][0])
    assert len(_train(tracer, model, optimizer, 2)) == 2
    tracer.close()


def test_move_copies_nested_batches_and_counts_bytes() -> None:
    Pair = __import__("collections").namedtuple("Pair", "a b")
    batch = {"img": torch.ones(4, 3, dtype=torch.float32), "meta": [torch.zeros(2, dtype=torch.int64), "name"],
             "pair": Pair(torch.ones(5, dtype=torch.uint8), 7)}
    moved, size = move(batch, "cpu")
    assert size == 4 * 3 * 4 + 2 * 8 + 5
    assert isinstance(moved["pair"], Pair) and moved["pair"].b == 7 and moved["meta"][1] == "name"


def test_loader_keeps_len_and_times_each_wait(collector: Any, endpoint: str) -> None:
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    assert len(tracer.loader(_data(3))) == 3

    class Slow:
        def __iter__(self) -> Any:
            for batch in _data(2):
                time.sleep(0.03)
                yield batch

    collector.joined()
    for x, y in tracer.loader(Slow()):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    tracer.close()
    iterations = _iterations(collector.until_bye())
    assert len(iterations) == 2
    for batch in iterations.values():
        (wait,) = [e for e in batch.events if e.phase == "load"]
        assert wait.duration_ns >= 25_000_000


def test_unknown_category_for_a_custom_task_is_refused(endpoint: str) -> None:
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    with pytest.raises(ValueError, match="unknown category"):
        tracer.task("x", "disk")
    tracer.close()


def test_a_full_queue_drops_and_counts_instead_of_blocking(collector: Any, monkeypatch: pytest.MonkeyPatch,
                                                           endpoint: str) -> None:
    monkeypatch.setattr(instrument.publisher, "QUEUE_FRAMES", 0)
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    assert isinstance(tracer, Tracer)
    collector.joined()
    _train(tracer, model, optimizer, 3)
    tracer.close()
    collector.until_bye()
    frames = collector.decoded()
    assert not [f for f in frames if isinstance(f, wire.IterationBatch)]
    (bye,) = [f for f in frames if isinstance(f, wire.Bye)]
    assert bye.dropped_queue == 3  # the monitor is told what the queue dropped


def test_forked_dataloader_workers_leave_the_publisher_alone(endpoint: str) -> None:
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=2, multiprocessing_context="fork")
    for x, y in tracer.loader(loader):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert tracer.enabled and tracer.iteration == 4
    tracer.close()


def test_a_monitor_started_after_the_job_still_gets_a_hello(endpoint: str, make_collector: Any) -> None:
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    _train(tracer, model, optimizer, 2)
    time.sleep(1.0)  # past the early hellos: only the periodic one (every 2 s) can reach a late monitor
    late = make_collector(endpoint)
    late.joined()
    tracer.close()
    decoded = [wire.decode(f.payload) for f in late.until_bye()]
    hellos = [f for f in decoded if isinstance(f, wire.Hello)]
    assert hellos and hellos[0].world == 1 and hellos[0].model == "Net" and hellos[0].granularity == "block"
    assert hellos[0].params == sum(p.numel() for p in model.parameters())
    assert any(isinstance(f, wire.Bye) and f.iterations == 2 for f in decoded)


def test_a_publisher_that_cannot_start_disables_the_shim_not_training() -> None:
    model, optimizer = _setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracer = instrument.attach(model, optimizer, endpoint="nonsense://nowhere")
        deadline = time.monotonic() + 60  # the publisher thread fails, and warns, on its own time
        while not any("dagtop" in str(w.message) for w in caught) and time.monotonic() < deadline:
            time.sleep(0.02)
        losses = _train(tracer, model, optimizer, 3)
    assert len([w for w in caught if "dagtop" in str(w.message)]) == 1
    assert not tracer.enabled and len(losses) == 3
    tracer.close()


def test_a_rank_sends_its_host_and_gpu_telemetry_with_its_hostname(
        collector: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("instrument.telemetry.FIRST_AFTER_S", 0.05)
    monkeypatch.setattr("instrument.telemetry.EVERY_S", 0.1)
    model, optimizer = _setup()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    _train(tracer, model, optimizer, 3)
    collector.wait_for(lambda frames: sum(isinstance(f, wire.Telemetry) for f in frames) >= 2, "two telemetry frames")
    tracer.close()
    decoded = [wire.decode(f.payload) for f in collector.until_bye()]
    telemetry = [f for f in decoded if isinstance(f, wire.Telemetry)]
    t = telemetry[-1]
    assert (t.host, t.rank, t.local_rank) == (socket.gethostname(), 0, 0)
    assert t.gpu is None and t.note == "on CPU"  # a CPU rank: no GPU to report, and it says so
    if sys.platform == "linux":  # local rank 0 sends the host-wide figures, read from /proc
        h = t.host_stats
        assert h is not None and h.cpu_percent is not None and 0.0 <= h.cpu_percent <= 100.0
        assert h.mem_used is not None and h.mem_total is not None and 0 < h.mem_used < h.mem_total
    seqs = [f.seq for f in decoded]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # numbered with the other frames: no false gaps


def test_telemetry_off_by_environment(collector: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGTOP_TELEMETRY", "0")
    monkeypatch.setattr("instrument.telemetry.FIRST_AFTER_S", 0.0)
    monkeypatch.setattr("instrument.telemetry.EVERY_S", 0.02)
    model, optimizer = _setup()
    before = shim_threads()
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    assert [t.name for t in shim_threads() - before] == [PUBLISHER]  # no telemetry thread
    collector.joined()
    _train(tracer, model, optimizer, 2)
    time.sleep(0.2)
    tracer.close()
    assert not [f for f in collector.decoded() if isinstance(f, wire.Telemetry)]
