"""A called module's own work (instrument/spans.py): the model's loss inside forward, a block's attention math
between its timed layers. It is timed under the module's name, so that nothing a called module ran is left to
"other", and it never overlaps the tasks it surrounds."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import instrument
from instrument import wire
from instrument.spans import MIN_GAP_NS, fill_spans
from instrument.units import layer_units, span_levels

US = 1_000
COVERED = 0.75
"""The share of a pass's forward and backward that its timed tasks cover at the least. Untimed, the attention math
was ~half of it (51 % "other" on GPT-2, issue #9); timed, the gaps left are the hooks' dispatch, tens of µs in
milliseconds, but a loaded 2-core machine preempts the training thread between hooks: a CI run saw 87.6 % covered
on one GPT-2 step, under the 90 % asked before."""


def _task(name: str, start_us: int, end_us: int, lane: str = "main", phase: str = "forward") -> tuple[Any, ...]:
    return ("compute", phase, name, lane, start_us * US, end_us * US, 0)


def test_a_span_becomes_the_stretches_its_children_leave() -> None:
    out = fill_spans([_task("block", 0, 1000, "span:main"), _task("block.fc1", 100, 400),
                      _task("block.fc2", 600, 990)])
    own = sorted((e[4] // US, e[5] // US) for e in out if e[2] == "block")
    assert own == [(0, 100), (400, 600)]  # the 10 µs before the end is the hooks' dispatch: left out
    assert all(e[3] == "main" for e in out)


def test_nested_spans_fill_inside_out_and_lanes_stay_apart() -> None:
    out = fill_spans([
        _task("model", 0, 1000, "span:main"),
        _task("model.block", 100, 900, "span:main"),
        _task("model.block.fc", 200, 800),
        _task("other lane", 0, 1000, "gpu"),  # another lane covers nothing of the main lane's spans
    ])
    by_name = {}
    for e in out:
        by_name.setdefault(e[2], []).append((e[4] // US, e[5] // US))
    assert sorted(by_name["model.block"]) == [(100, 200), (800, 900)]
    assert sorted(by_name["model"]) == [(0, 100), (900, 1000)]


def test_without_spans_the_events_are_untouched() -> None:
    events = [_task("a", 0, 10), _task("b", 10, 20)]
    assert fill_spans(events) == events


_intervals = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 500)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(tasks=_intervals, spans=_intervals)
def test_filled_spans_never_overlap_a_task_and_leave_no_long_gap(tasks: list[tuple[int, int]],
                                                                  spans: list[tuple[int, int]]) -> None:
    # Tasks of one lane that do not overlap each other (one thread), spans anywhere around them.
    laid, at = [], 0
    for gap, length in tasks:
        laid.append(_task(f"t{len(laid)}", at + gap, at + gap + length))
        at += gap + length
    span_events = [_task(f"s{i}", start, start + length, "span:main") for i, (start, length) in enumerate(spans)]
    out = fill_spans(laid + span_events)
    assert all(e[3] == "main" for e in out) and out[: len(laid)] == laid
    intervals = sorted((e[4], e[5]) for e in out)
    assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:])), "two tasks overlap on the lane"
    for s in span_events:  # every stretch of a span at least MIN_GAP_NS long is covered by something
        at = s[4]
        for a, b in intervals:
            if b <= at or a >= s[5]:
                continue
            assert a - at < MIN_GAP_NS
            at = max(at, b)
        assert s[5] - at < MIN_GAP_NS


# ---------------------------------------------------------------------------------------------- on a model


class Attention(nn.Module):
    """Its projections are layers; the attention math between them is its own work, as in HF's GPT-2."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        for _ in range(3):  # heavier than the projections, so that untimed it would dominate
            weights = torch.softmax(weights @ weights.transpose(-1, -2), dim=-1)
        return self.proj(weights @ v)


class Model(nn.Module):
    def __init__(self, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.layers = nn.ModuleList(Attention(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = x + layer(x)
        return x.square().mean()  # the loss, computed inside forward as HF models do


def test_the_spans_of_a_model_are_the_modules_around_its_layers_by_depth() -> None:
    model = Model()
    levels = span_levels(model, layer_units(model))
    assert [[name for name, _ in level] for level in levels] == [["Model"], ["layers.0", "layers.1"]]


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("DAGTOP_TELEMETRY", "0")):
        monkeypatch.setenv(name, value)


def _train_and_collect(model: nn.Module, inputs: Any, steps: int, granularity: str, collector: Any,
                       endpoint: str) -> list[wire.IterationBatch]:
    """Train ``steps`` steps (``inputs()`` gives a step's forward kwargs; the model returns its loss) timed."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = instrument.attach(model, optimizer, endpoint=endpoint, granularity=granularity)
    collector.joined()
    for _ in range(steps):
        loss = model(**inputs())
        loss = loss if isinstance(loss, torch.Tensor) else loss.loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tracer.close()
    frames = (wire.decode(raw.payload) for raw in collector.until_bye())
    batches = [f for f in frames if isinstance(f, wire.IterationBatch)]
    assert len(batches) == steps
    return batches


@pytest.mark.parametrize("granularity", ["block", "layer"])
def test_nothing_a_called_module_ran_is_left_to_other(granularity: str, collector: Any, endpoint: str,
                                                      one_rank: None) -> None:
    torch.manual_seed(0)
    batches = _train_and_collect(Model(), lambda: {"x": torch.randn(512, 32)}, 4, granularity, collector, endpoint)
    for batch in batches:
        compute = sorted((e for e in batch.events if e.phase in ("forward", "backward")), key=lambda e: e.start_ns)
        assert all(a.end_ns <= b.start_ns for a, b in zip(compute, compute[1:])), "tasks overlap on the lane"
        span = compute[-1].end_ns - compute[0].start_ns
        covered = sum(e.duration_ns for e in compute)
        # Untimed, the attention math alone is most of the pass at layer granularity; timed, the gaps left are
        # the hooks' dispatch (tens of µs in a pass of milliseconds).
        assert covered >= COVERED * span, f"{granularity}: {covered / span:.0%} of forward and backward timed"
        names = {e.name for e in compute}
        if granularity == "layer":
            assert {"layers.0", "layers.1"} <= names  # each attention's own work under its name
            assert {"layers.0.qkv", "layers.1.proj", "embed"} <= names
        else:
            assert {"embed", "layers.0", "layers.1"} <= names


def test_a_gpt2_timed_per_layer_leaves_nothing_of_its_attention_to_other(collector: Any, endpoint: str,
                                                                      one_rank: None) -> None:
    """Hugging Face's GPT-2 per layer: the attention math between c_attn and c_proj and the loss inside the
    model's forward were untimed, 51 % of the critical path as "other" (issue #9); they are their modules' now."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                                     bos_token_id=None, eos_token_id=None)

    def tokens() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 512, (8, 64))
        return {"input_ids": ids, "labels": ids}

    batches = _train_and_collect(transformers.GPT2LMHeadModel(config), tokens, 3, "layer", collector, endpoint)
    for batch in batches:
        compute = [e for e in batch.events if e.phase in ("forward", "backward")]
        span = max(e.end_ns for e in compute) - min(e.start_ns for e in compute)
        covered = sum(e.duration_ns for e in compute)
        assert covered >= COVERED * span, f"{covered / span:.0%} of forward and backward timed"
        names = {e.name for e in compute}
        assert {"transformer.h.0.attn", "transformer.h.1.mlp", "GPT2LMHeadModel"} <= names, names
