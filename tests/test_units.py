"""Which modules the shim times: blocks through wrappers and containers, and where their backward starts and ends
(compiled modules: test_units_compiled.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from unit_models import LM, iterations, train

import instrument
from instrument import wire
from instrument.units import block_units, layer_units


def _names(units: list[tuple[str, nn.Module]]) -> list[str]:
    return [name for name, _ in units]


def test_blocks_are_the_layers_of_the_model_a_wrapper_holds_beside_its_head() -> None:
    assert _names(block_units(LM())) == ["transformer.wte", "transformer.h.0", "transformer.h.1",
                                         "transformer.h.2", "transformer.ln_f", "lm_head"]


def test_a_model_without_a_dominant_child_keeps_its_top_level_children_that_hold_parameters() -> None:
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.Dropout(), nn.Linear(64, 8))
    assert _names(block_units(model)) == ["0", "2", "4"]
    assert _names(block_units(nn.Sequential(model))) == ["0.0", "0.2", "0.4"]  # one child: descend
    assert _names(block_units(nn.Sequential(nn.ReLU(), nn.Tanh()))) == ["0", "1"]  # nothing else to time


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


def test_a_unit_fed_no_gradient_ends_at_its_last_accumulation_and_keeps_one_hook(
        collector: Any, endpoint: str) -> None:
    """The embedding's input (token ids) has no gradient: its backward ends when its weight's gradient is
    accumulated. After one backward, only the hook on the last-accumulated parameter stays."""
    model = LM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    train(model, tracer, optimizer, 4)
    wte = next(u for u in tracer._blocks.units if u.name == "transformer.wte")
    assert wte.grad_hooks is not None and len(wte.grad_hooks) == 1
    tracer.close()
    batches = iterations(collector)
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
    batches = iterations(collector)
    assert len(batches) == 3
    for batch in batches:
        # The residual block's own work (its relu and sum) is its own task, "1" (tests/test_spans.py).
        bwd = {e.name: e for e in batch.events if e.phase == "backward" and e.name not in ("1", "Sequential")}
        assert set(bwd) == {"0", "1.main1", "1.main2", "1.shortcut", "2"}
        # Each layer's backward is its own: no layer's span holds another's (they ran one after the other).
        spans = sorted((e.start_ns, e.end_ns, e.name) for e in bwd.values())
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
            assert e1 <= s2, f"{n1} [{s1}, {e1}] overlaps {n2} [{s2}, {e2}]"


def _main_lane_in_order(batch: wire.IterationBatch) -> None:
    main = sorted((e for e in batch.events if e.lane == "main"), key=lambda e: e.start_ns)
    for a, b in zip(main, main[1:]):
        assert a.end_ns <= b.start_ns, f"{a.phase} {a.name} [{a.start_ns}, {a.end_ns}] overlaps {b.phase} {b.name}"


class Skip(nn.Module):
    """A residual block whose output is the sum itself: its last node also takes the block's input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def test_a_block_ending_in_its_residual_sum_ends_its_backward_where_the_block_before_begins(
        collector: Any, endpoint: str) -> None:
    """The sum's node takes the input and the branch: it is not the block's whole backward, the input's node is."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), Skip(), nn.Linear(32, 200))
    assert _names(block_units(model)) == ["0", "1", "2"]
    for bwd in _backwards_of_three_steps(model, collector, endpoint):
        assert bwd["1"].end_ns == bwd["0"].start_ns  # one stamp: the gradient of the block's input is complete


def test_layers_in_a_chain_end_their_backward_where_the_layer_before_begins(collector: Any, endpoint: str) -> None:
    """Nothing else took a layer's input: its backward ends where the gradient reaches that input, the stamp the
    layer before starts from (instrument/autograd.py's chained), with no hook of its own; its parameters'
    accumulation is its own work, not a gap between the two. A ReLU between two layers is no block: its backward
    lies between theirs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    backwards = _backwards_of_three_steps(model, collector, endpoint)
    assert len(backwards) == 3
    for bwd in backwards:
        assert sorted(bwd.keys() - {"Sequential"}) == ["0", "1", "2", "4"]  # the model's own time may be there too
        assert bwd["4"].end_ns < bwd["2"].start_ns  # the ReLU's backward, between
        assert bwd["2"].end_ns == bwd["1"].start_ns and bwd["1"].end_ns == bwd["0"].start_ns


def _backwards_of_three_steps(model: nn.Module, collector: Any, endpoint: str) -> list[dict[str, Any]]:
    """Three steps of ``model`` (inputs of 8 features) timed by blocks: each iteration's backward tasks by name."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(64, 8)).square().mean().backward()
        optimizer.step()
    tracer.close()
    return [{e.name: e for e in batch.events if e.phase == "backward"} for batch in iterations(collector)]


def test_each_micro_batch_keeps_the_backward_of_the_unit_fed_no_gradient(collector: Any, endpoint: str) -> None:
    """The embedding's backward ends at its last accumulation: the next micro-batch's forward emits it."""
    model = LM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint)
    collector.joined()
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        for _ in range(3):
            ids = torch.randint(50, (4, 8), generator=g)
            (nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()) / 3).backward()
        optimizer.step()
        optimizer.zero_grad()
    tracer.close()
    batches = iterations(collector)
    assert len(batches) == 3
    for batch in batches:
        blocks = _names(block_units(model))
        names = [e.name for e in batch.events if e.phase == "backward" and e.name in blocks]
        assert {n: names.count(n) for n in set(names)} == {name: 3 for name in blocks}
        _main_lane_in_order(batch)


class Checkpointed(nn.Module):
    """Embedding, three residual layers run through activation checkpointing, head."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.wte = nn.Embedding(50, 32)
        self.h = nn.ModuleList(Skip() for _ in range(3))
        self.head = nn.Linear(32, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for layer in self.h:
            if torch.is_grad_enabled():  # as transformers does: checkpointing is for training
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=self.reentrant)
            else:
                x = layer(x)
        return self.head(x)


@pytest.mark.parametrize("granularity", ["block", "layer"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_layer_has_one_forward_and_one_backward_that_holds_its_recompute(
        collector: Any, endpoint: str, reentrant: bool, granularity: str) -> None:
    """Reentrant, the forward runs under no_grad and backward runs it again: neither may go untimed or twice.
    The recompute is in the backward of the layer (block) or, per layer, of the segment's last layer."""
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint, granularity=granularity)
    collector.joined()
    units = [name for name, _ in (layer_units if granularity == "layer" else block_units)(model)]
    train(model, tracer, optimizer, 3)
    with torch.no_grad():  # evaluation is not timed, and does not disturb the next iteration
        model(torch.randint(50, (4, 8)))
    train(model, tracer, optimizer, 1)
    tracer.close()
    batches = iterations(collector)
    assert len(batches) == 4
    for batch in batches:
        timed = sorted((e for e in batch.events if e.name in units), key=lambda e: e.start_ns)
        assert [e.name for e in timed if e.phase == "forward"] == units
        backward = [e for e in timed if e.phase == "backward"]
        assert [e.name for e in backward] == units[::-1]
        own = {e.name for e in batch.events if e.phase in ("forward", "backward")} - set(units)
        assert own <= {"Checkpointed", "h.0", "h.1", "h.2"}, own  # modules around the units (tests/test_spans.py)
        _main_lane_in_order(batch)
        if batch.iteration == 0:  # warm-up: the first checkpointed backward initialises things (12 ms seen)
            continue
        span = backward[-1].end_ns - backward[0].start_ns
        gaps = [(earlier.start_ns - later.end_ns, later.name, earlier.name) for later, earlier in zip(backward, backward[1:])]
        untimed = sum(g for g, _, _ in gaps)
        # the recompute is in a backward: untimed, it would be most of the span
        assert untimed < 0.5 * span, (batch.iteration, span, gaps)
