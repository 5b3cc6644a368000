"""Compiled modules and the shim: timed from outside their graphs, never splitting them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from unit_models import LM, Layer, iterations, train

import instrument


def test_a_compiled_model_is_timed_without_breaking_its_graph(collector: Any, endpoint: str) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = torch.compile(LM(), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    counters.clear()
    train(model, tracer, optimizer, 4)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # One unit fed no gradient, with 15 parameters: a stamp per accumulation only in the first backward.
    (unit,) = tracer._blocks.units
    assert len(unit.params) == 15 and unit.grad_hooks is not None and len(unit.grad_hooks) == 1
    tracer.close()
    batches = iterations(collector)
    assert len(batches) == 4
    for batch in batches:
        phases = {(e.phase, e.name) for e in batch.events}
        assert {("forward", "LM"), ("backward", "LM"), ("update", "optimizer.step")} <= phases, phases


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(50, 16)
        self.h = nn.ModuleList(Layer() for _ in range(2))
        self.head = nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for layer in self.h:
            x = layer(x)
        return self.head(x)


def _dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "frames": counters["frames"]["total"],
            "breaks": sum(counters["graph_break"].values()), "unimplemented": sum(counters["unimplemented"].values())}


def test_blocks_compiled_in_place_are_timed_around_their_compiled_call(collector: Any, endpoint: str) -> None:
    """``layer.compile()`` compiles the layer's hooks with it: they must not run there, so the compiled call is
    wrapped; Dynamo compiles what it compiles without dagtop (one graph, one frame, no break)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = Blocks()
    for layer in model.h:
        layer.compile(backend="eager")
    compiled_call = model.h[0]._compiled_call_impl
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    counters.clear()
    train(model, tracer, optimizer, 3)
    assert _dynamo_counts() == {"graphs": 1, "frames": 1, "breaks": 0, "unimplemented": 0}
    tracer.close()
    assert model.h[0]._compiled_call_impl is compiled_call  # put back
    for batch in iterations(collector):
        blocks = [e for e in batch.events if e.name != "Blocks"]  # the model's own work (tests/test_spans.py)
        assert [e.name for e in blocks if e.phase == "forward"] == ["wte", "h.0", "h.1", "head"]
        assert sorted(e.name for e in blocks if e.phase == "backward") == ["h.0", "h.1", "head", "wte"]


def _compiled_after_attach(attach: bool, collector: Any, endpoint: str) -> dict[str, int]:
    """Train ``Blocks`` whose layers are compiled after attach (in place, and by swapping in a compiled module)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Blocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint) if attach else instrument.NullTracer()
    if attach:
        collector.joined()
    model.h[0].compile(backend="eager")
    model.h[1] = torch.compile(model.h[1], backend="eager")
    counters.clear()
    train(model, tracer, optimizer, 3)
    tracer.close()
    return _dynamo_counts()


def test_blocks_compiled_after_attach_are_not_split_by_the_hooks_inside_them(collector: Any, endpoint: str) -> None:
    """Hooked before they were compiled, the layers' hooks are in the traced region now: they do nothing there,
    and Dynamo compiles what it compiles without dagtop."""
    without = _compiled_after_attach(False, collector, endpoint)
    with_dagtop = _compiled_after_attach(True, collector, endpoint)
    # Dynamo may compile a hook as a frame of its own (an empty one: the hook returns at once), never split a graph
    del without["frames"], with_dagtop["frames"]
    assert with_dagtop == without and without["breaks"] == without["unimplemented"] == 0
    names = {e.name for batch in iterations(collector) for e in batch.events if e.phase == "forward"}
    # The compiled layers are not timed on their own: their time is the model's, which called them.
    assert names == {"wte", "head", "Blocks"}


def test_compiled_autograd_is_not_split_by_the_backward_hooks(collector: Any, endpoint: str) -> None:
    """Compiled autograd traces the hooks of the backward it compiles: dagtop's take no stamp there, so the
    backward stays one graph compiled from one frame, with no break (the backward is then untimed)."""
    from torch._dynamo import compiled_autograd

    torch._dynamo.reset()
    model = Blocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    torch._dynamo.utils.counters.clear()
    for _ in range(2):
        ids = torch.randint(50, (4, 8))
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        optimizer.zero_grad()
        with compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
        optimizer.step()
    assert _dynamo_counts() == {"graphs": 1, "frames": 1, "breaks": 0, "unimplemented": 0}
    tracer.close()
    for batch in iterations(collector):  # backward untimed; the rest as ever
        assert [e.phase for e in batch.events if e.name != "Blocks"] == ["forward"] * 4 + ["update"]


def test_attach_warns_once_that_compiled_autograd_leaves_backward_untimed(
        endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo

    from instrument import compiled

    monkeypatch.setattr(torch._dynamo.config, "compiled_autograd", True)
    compiled.warn_if_backward_is_compiled.cache_clear()
    model = Blocks()
    with pytest.warns(RuntimeWarning, match="compiled autograd is on") as caught:
        tracer = instrument.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), endpoint=endpoint)
    tracer.close()
    compiled.warn_if_backward_is_compiled.cache_clear()
    assert len(caught) == 1 and caught[0].filename == __file__
