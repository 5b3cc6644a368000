"""The shim's small units on their own: the iteration boundary driven by fake hooks, the settings' one rule, the
events' vocabulary, and the tracer protocol both tracers keep (``DAGTOP_DISABLE=1`` included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import instrument
from instrument import events, settings
from instrument.boundary import IterationBoundary
from instrument.events import TaskState
from instrument.ranktracer import NullTracer, RankTracer
from instrument.tracer import Tracer
from instrument.whereabouts import Whereabouts

ROOT = Path(__file__).resolve().parent.parent


class FakeRank:
    """Drives an :class:`IterationBoundary` as the tracer's hooks would, recording what it hands over."""

    def __init__(self, optimizers: int = 1) -> None:
        self.events: list[str] = []
        self.handed: list[list[str]] = []
        self.boundary = IterationBoundary(self.events, optimizers, self._end)

    def _end(self, cut: int | None) -> None:
        cut = len(self.events) if cut is None else cut
        self.handed.append(self.events[:cut])
        del self.events[:cut]

    def task(self, name: str) -> None:
        self.boundary.task()
        self.events.append(name)

    def forward(self, synced: bool | None = None) -> None:
        self.boundary.forward_began(synced)
        self.events.append("forward")

    def backward(self) -> None:
        self.boundary.backward_began(None)
        self.events.append("backward")

    def step(self, name: str = "step") -> None:
        self.boundary.step_began()
        self.events.append(name)
        self.boundary.step_ended()


def test_one_optimizer_ends_the_iteration_when_its_step_returns() -> None:
    rank = FakeRank()
    for _ in range(2):
        rank.task("load")
        rank.forward()
        rank.backward()
        rank.step()
    assert rank.handed == [["load", "forward", "backward", "step"]] * 2
    assert rank.events == []
    assert not rank.boundary.pending


def test_several_optimizers_end_at_the_next_forward_cut_after_the_last_step() -> None:
    rank = FakeRank(optimizers=2)
    rank.task("load")
    rank.forward()
    rank.backward()
    rank.step("step 0")
    rank.step("step 1")
    assert rank.handed == [] and rank.boundary.pending
    rank.task("load")  # the next iteration's loader wait, before its forward
    rank.forward()
    assert rank.handed == [["load", "forward", "backward", "step 0", "step 1"]]
    assert rank.events == ["load", "forward"]


def test_a_skipped_step_ends_at_the_next_forward_cut_before_the_next_loader_wait() -> None:
    rank = FakeRank()
    rank.forward()
    rank.backward()
    rank.step()  # learns the cadence: one backward per step
    rank.task("load")
    rank.forward()
    rank.backward()  # GradScaler skips this step
    rank.task("load")
    rank.forward()
    assert rank.handed == [["forward", "backward", "step"], ["load", "forward", "backward"]]
    assert rank.events == ["load", "forward"]


def test_gradient_accumulation_without_ddp_steps_at_its_cadence() -> None:
    rank = FakeRank()
    for _ in range(2):  # two micro-batches, then a step: the cadence is 2
        rank.forward()
        rank.backward()
    rank.step()
    rank.forward()
    rank.backward()
    rank.forward()  # the second micro-batch of the next iteration: not a new iteration
    assert len(rank.handed) == 1
    rank.backward()
    rank.forward()  # two backwards and no step: skipped, so the iteration ends here
    assert rank.handed[1] == ["forward", "backward", "forward", "backward"]


def test_before_its_first_step_nothing_is_taken_for_skipped() -> None:
    rank = FakeRank()
    for _ in range(3):
        rank.forward()
        rank.backward()
    assert rank.handed == []


def test_ddp_says_whether_a_step_was_due() -> None:
    rank = FakeRank()
    rank.forward(synced=False)  # under no_sync: the backward all-reduces nothing
    rank.backward()
    rank.forward(synced=True)
    assert rank.handed == []
    rank.backward()  # all-reduced: a step was due, and none came
    rank.forward(synced=False)
    assert rank.handed == [["forward", "backward", "forward", "backward"]]


def test_a_forward_inside_a_step_begins_no_iteration() -> None:
    rank = FakeRank(optimizers=2)
    rank.forward()
    rank.backward()
    rank.step("step 0")
    rank.boundary.step_began()  # step(closure): forward and backward run inside the step
    assert rank.boundary.in_step
    rank.forward()
    assert rank.handed == []
    rank.boundary.step_ended()
    assert not rank.boundary.in_step


def test_closing_ends_an_iteration_that_has_a_backward() -> None:
    rank = FakeRank(optimizers=2)
    assert not rank.boundary.pending
    rank.forward()
    assert not rank.boundary.pending  # a forward alone (evaluation) is no iteration
    rank.backward()
    assert rank.boundary.pending
    rank.boundary.end(None)
    assert rank.handed == [["forward", "backward"]] and not rank.boundary.pending


@pytest.mark.parametrize(("value", "default", "expected"), [
    (None, False, False), ("", False, False), ("", True, True), ("1", False, True), ("yes", False, True),
    ("0", True, False), ("false", True, False), ("OFF", True, False), (" no ", True, False), ("2", False, True),
])
def test_every_switch_follows_one_rule(value: str | None, default: bool, expected: bool) -> None:
    environ = {} if value is None else {settings.HEARTBEAT: value}
    assert settings.switch(environ, settings.HEARTBEAT, default) is expected


def test_settings_read_every_variable_of_the_shim() -> None:
    said = settings.read({settings.DISABLE: "true", settings.ENDPOINT: "tcp://10.0.0.2:7000",
                          settings.HEARTBEAT: "0", settings.TELEMETRY: "off", settings.AUTH: "/keys"})
    assert said == settings.Settings(disabled=True, endpoint="tcp://10.0.0.2:7000", heartbeat=False,
                                     telemetry=False, auth="/keys")
    assert settings.read({}) == settings.Settings()
    assert settings.read({}).endpoint == instrument.DEFAULT_ENDPOINT


def test_no_other_module_of_the_shim_reads_a_dagtop_variable() -> None:
    readers = [p.name for p in (ROOT / "instrument").glob("*.py")
               if p.name != "settings.py" and "environ.get(\"DAGTOP_" in p.read_text()]
    assert readers == []


def test_collective_names_are_read_back_as_their_kind() -> None:
    for kind in events.CollectiveKind:
        name = events.collective_name(kind, "layers.0 (backward)")
        assert events.collective_kind(name) is kind
    assert events.collective_kind("bucket 3") is None  # DDP's bucket events: matched by name, gate the update
    assert events.collective_kind("backward all-gather") is None


def test_task_kinds_are_checked_when_declared() -> None:
    assert events.FORWARD.event("layers.0", "main", 1, 2) == ("compute", "forward", "layers.0", "main", 1, 2, 0)
    assert all(k.category in events.CATEGORIES and k.phase in events.PHASES for k in events.TASK_KINDS)
    with pytest.raises(ValueError, match="no task kind"):
        events.task_kind("computer", "forward")
    with pytest.raises(ValueError, match="no task kind"):
        events.custom("gpu")


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(tracer: RankTracer, model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    loss = torch.tensor(0.0)
    for x in tracer.loader([torch.randn(2, 4) for _ in range(3)]):
        x = tracer.to_device(x, tracer.device)
        with tracer.task("bookkeeping"):
            loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def test_both_tracers_keep_the_whole_protocol(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("DAGTOP_TELEMETRY", "0")
    monkeypatch.delenv("DAGTOP_DISABLE", raising=False)
    model, optimizer = _model()
    with instrument.attach(model, optimizer, endpoint=endpoint, granularity="layer", sample_every=3) as tracer:
        assert isinstance(tracer, Tracer) and isinstance(tracer, RankTracer)
        assert (tracer.endpoint, tracer.granularity, tracer.sample_every) == (endpoint, "layer", 3)
        assert tracer.device == torch.device("cpu") and tracer.enabled
        _train(tracer, model, optimizer)
        assert tracer.iteration == 3
    assert not tracer.enabled  # closed on the way out of the with block

    monkeypatch.setenv("DAGTOP_DISABLE", "1")
    model, optimizer = _model()
    with instrument.attach(model, optimizer, endpoint=endpoint, granularity="layer", sample_every=3) as null:
        assert isinstance(null, NullTracer) and isinstance(null, RankTracer)
        assert (null.endpoint, null.granularity, null.sample_every) == (endpoint, "layer", 3)
        assert (null.rank, null.world, null.local_rank) == (0, 1, 0)
        assert null.device == torch.device("cpu") and not null.enabled
        _train(null, model, optimizer)


def test_the_null_tracers_device_is_the_models() -> None:
    model = nn.Linear(2, 2).to(torch.float64)
    assert NullTracer(model).device == torch.device("cpu")
    assert NullTracer(nn.ReLU()).device == torch.device("cpu")  # no parameters
    assert NullTracer().device == torch.device("cpu")
    meta = nn.Linear(2, 2, device="meta")
    assert NullTracer([meta, model]).device == torch.device("meta")  # of several models, the first one's


def test_tracer_device_works_under_dagtop_disable_in_a_fresh_process() -> None:
    script = ("import torch, instrument\n"
              "m = torch.nn.Linear(2, 2)\n"
              "t = instrument.attach(m, torch.optim.SGD(m.parameters(), lr=0.1))\n"
              "print(type(t).__name__, t.device, t.granularity, t.endpoint)\n")
    env = {**os.environ, "DAGTOP_DISABLE": "1", "DAGTOP_ENDPOINT": "tcp://127.0.0.1:9", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    assert run.stdout.split() == ["NullTracer", "cpu", "block", "tcp://127.0.0.1:9"]


def test_the_boundary_probe_and_settings_load_without_torch() -> None:
    script = ("import sys, instrument.boundary, instrument.probe, instrument.settings, instrument.events\n"
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'zmq', 'numpy'}))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout.strip() == "[]"


def _rank_at(**state: object) -> SimpleNamespace:
    """The parts of a tracer the heartbeat's whereabouts read, all quiet unless given."""
    units = SimpleNamespace(units=[])
    quiet = dict(_script=None, _comm=None, _loading=None, _update_starts={}, _detailed_now=False, _layers=units,
                 _blocks=units, _events=[], iteration=0)
    return SimpleNamespace(**{**quiet, **state})


def test_the_heartbeat_says_what_its_task_is_beside_its_name() -> None:
    """The state is set where the task is found: the monitor reads it and never the name's grammar."""
    def where(**state: object) -> tuple[str, TaskState]:
        _, task, _, said = Whereabouts(_rank_at(**state))()  # type: ignore[arg-type]
        return task, said

    unit = SimpleNamespace(name="layers.3", fwd_start=None, bwd_start=5, last_grad=None)
    assert where() == ("", TaskState.UNKNOWN)  # before the first task
    assert where(_script=SimpleNamespace(in_flight=lambda: ("barrier (script)", 5))) == ("barrier (script)",
                                                                                      TaskState.COLLECTIVE)
    assert where(_comm=SimpleNamespace(in_flight=lambda: ("bucket 7", 5))) == ("all-reduce bucket 7", TaskState.COLLECTIVE)
    assert where(_loading=5) == ("loader next", TaskState.OPEN)
    assert where(_update_starts={"optimizer.step": 5}) == ("optimizer.step", TaskState.OPEN)
    assert where(_blocks=SimpleNamespace(units=[unit])) == ("backward layers.3", TaskState.OPEN)
    assert where(_events=[("compute", "update", "optimizer.step", "main", 1, 5, 0)]) == ("after optimizer.step",
                                                                                          TaskState.BETWEEN)
    assert where(iteration=3) == ("between iterations", TaskState.BETWEEN)
    assert where(_comm=SimpleNamespace(in_flight=lambda: 1 / 0)) == ("", TaskState.UNKNOWN)  # a look that failed


def test_ddps_bucket_copies_and_the_accumulating_adds_are_timed_on_cpu_ranks() -> None:
    from instrument.passes import gradient_passes
    model = nn.Linear(256, 256)
    copies, adds = gradient_passes(SimpleNamespace(module=model, gradient_as_bucket_view=False), 64 << 20)
    assert copies > 0 and adds > 0
    viewed = gradient_passes(SimpleNamespace(module=model, gradient_as_bucket_view=True), 64 << 20)
    assert viewed[0] == 0 and viewed[1] > 0  # the gradients are the buckets: no copy, the adds still
    assert gradient_passes(SimpleNamespace(module=model, gradient_as_bucket_view=False), 0) == (0, 0)
