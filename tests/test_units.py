"""Which modules the shim times: blocks through wrappers and containers, compiled modules from outside."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import instrument
from instrument import wire
from instrument.timing import block_units, layer_units


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln(x))


class Transformer(nn.Module):
    """Laid out like HF's GPT-2: the layers in a ModuleList, which is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(50, 16)
        self.h = nn.ModuleList(Layer() for _ in range(3))
        self.ln_f = nn.LayerNorm(16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for layer in self.h:
            x = layer(x)
        return self.ln_f(x)


class LM(nn.Module):
    """A thin wrapper holding the transformer and a head tied to its embedding (``*ForCausalLM``)."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = Transformer()
        self.lm_head = nn.Linear(16, 50, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.transformer(ids))


def _names(units: list[tuple[str, nn.Module]]) -> list[str]:
    return [name for name, _ in units]


def test_blocks_are_the_layers_of_the_model_a_wrapper_holds_beside_its_head() -> None:
    assert _names(block_units(LM())) == ["transformer.wte", "transformer.h.0", "transformer.h.1",
                                         "transformer.h.2", "transformer.ln_f", "lm_head"]


def test_a_model_without_a_dominant_child_keeps_its_top_level_children() -> None:
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.Linear(64, 8))
    assert _names(block_units(model)) == ["0", "1", "2", "3"]
    assert _names(block_units(nn.Sequential(model))) == ["0.0", "0.1", "0.2", "0.3"]  # one child: descend


def test_a_compiled_module_is_one_unit_hooked_from_outside() -> None:
    model = LM()
    compiled = torch.compile(model, backend="eager")
    assert block_units(compiled) == [("LM", compiled)]
    assert layer_units(compiled) == [("LM", compiled)]
    model.transformer.h[1] = torch.compile(model.transformer.h[1], backend="eager")
    names = _names(layer_units(model))
    assert "transformer.h.1" in names and not any(n.startswith("transformer.h.1.") for n in names)
    assert "transformer.h.0.fc" in names


def test_a_tied_weight_is_hooked_once_at_layer_granularity() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model.append(model[0])  # the same module called twice
    assert _names(layer_units(model)) == ["0"]


def _iterations(collector: Any) -> list[wire.IterationBatch]:
    frames = (wire.decode(r.payload) for r in collector.until_bye())
    return [f for f in frames if isinstance(f, wire.IterationBatch)]


def _train(model: nn.Module, tracer: Any, optimizer: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(50, (4, 8), generator=g)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_compiled_model_is_timed_without_breaking_its_graph(collector: Any, endpoint: str) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = torch.compile(LM(), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    counters.clear()
    _train(model, tracer, optimizer, 4)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # One unit fed no gradient, with 15 parameters: a stamp per accumulation only in the first backward.
    (unit,) = tracer._blocks.units
    assert len(unit.params) == 15 and unit.grad_hooks is not None and len(unit.grad_hooks) == 1
    tracer.close()
    batches = _iterations(collector)
    assert len(batches) == 4
    for batch in batches:
        phases = {(e.phase, e.name) for e in batch.events}
        assert {("forward", "LM"), ("backward", "LM"), ("update", "optimizer.step")} <= phases, phases


def test_a_unit_fed_no_gradient_ends_at_its_last_accumulation_and_keeps_one_hook(
        collector: Any, endpoint: str) -> None:
    """The embedding's input (token ids) has no gradient: its backward ends when its weight's gradient is
    accumulated. After one backward, only the hook on the last-accumulated parameter stays."""
    model = LM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    _train(model, tracer, optimizer, 4)
    wte = next(u for u in tracer._blocks.units if u.name == "transformer.wte")
    assert wte.grad_hooks is not None and len(wte.grad_hooks) == 1
    tracer.close()
    batches = _iterations(collector)
    assert len(batches) == 4
    for batch in batches:
        backward = {e.name: e for e in batch.events if e.phase == "backward"}
        # The tied weight's gradient is complete only after the head's and every layer's backward.
        assert backward["transformer.wte"].end_ns >= max(e.end_ns for e in backward.values())


class Residual(nn.Module):
    """A ResNet-style block: the main branch and a one-layer shortcut read the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.main1 = nn.Linear(32, 32)
        self.main2 = nn.Linear(32, 32)
        self.shortcut = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main2(torch.relu(self.main1(x))) + self.shortcut(x)


def test_a_shortcut_layer_ends_its_backward_when_it_is_done_not_when_the_other_branch_is(
        collector: Any, endpoint: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), Residual(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint, granularity="layer")
    collector.joined()
    for _ in range(3):
        loss = model(torch.randn(64, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tracer.close()
    batches = _iterations(collector)
    assert len(batches) == 3
    for batch in batches:
        bwd = {e.name: e for e in batch.events if e.phase == "backward"}
        assert set(bwd) == {"0", "1.main1", "1.main2", "1.shortcut", "2"}
        # Each layer's backward is its own: no layer's span holds another's (they ran one after the other).
        spans = sorted((e.start_ns, e.end_ns, e.name) for e in bwd.values())
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
            assert e1 <= s2, f"{n1} [{s1}, {e1}] overlaps {n2} [{s2}, {e2}]"
