"""Forward and backward timing of model units (blocks or layers) with module and autograd-node hooks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

MAX_PENDING_EVENTS = 200_000
"""Forwards with gradients but no optimizer step (a validation loop without no_grad) stop being timed here."""

Stamp = Callable[[], Any]
"""Returns a timestamp: ``perf_counter_ns()`` on CPU, a recorded CUDA event on a GPU."""


_grad_enabled = torch.is_grad_enabled
_graph_task_id = torch._C._current_graph_task_id


def _training_forward() -> bool:
    # Under activation checkpointing the forward runs again inside backward (graph task id >= 0):
    # that recompute is part of the backward we already time, so the forward hooks stay quiet.
    return _grad_enabled() and _graph_task_id() == -1


class Switch:
    """Whether the shim is timing: one flag shared by every hook (an attribute read, cheaper than a call)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True


def _grad_fns(value: Any) -> list[Any]:
    """The autograd nodes that produced the tensors of a module's input or output (tensor, tuple, list, dict).

    Runs twice per timed module per iteration: the common shapes (a tensor, a 1-tuple of args) come first.
    """
    if isinstance(value, torch.Tensor):
        return [] if value.grad_fn is None else [value.grad_fn]
    if type(value) is tuple and len(value) == 1 and isinstance(value[0], torch.Tensor):
        node = value[0].grad_fn
        return [] if node is None else [node]
    nodes: list[Any] = []
    _collect(value, nodes, 0)
    return nodes


def _collect(value: Any, nodes: list[Any], depth: int) -> None:
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None and all(value.grad_fn is not n for n in nodes):
            nodes.append(value.grad_fn)
    elif depth < 2 and isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, nodes, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for item in value.values():
            _collect(item, nodes, depth + 1)


def block_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks of a model: the top-level children, descending while there is exactly one child."""
    names = {id(m): n for n, m in root.named_modules()}
    node = root
    while True:
        children = list(node.children())
        if len(children) != 1:
            break
        node = children[0]
    if not children:
        return [(names[id(node)] or type(node).__name__, node)]
    return [(names[id(c)], c) for c in children]


def layer_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers of a model: the leaf modules that own trainable parameters."""
    units = [
        (name or type(m).__name__, m)
        for name, m in root.named_modules()
        if next(m.children(), None) is None and any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    return units or block_units(root)


class Unit:
    """One timed module: its hooks and the state of its current forward/backward."""

    __slots__ = ("name", "module", "params", "fwd_start", "bwd_start", "last_grad", "grad_hooks")

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.fwd_start: Any = None
        self.bwd_start: Any = None
        self.last_grad: Any = None
        self.grad_hooks: list[Any] | None = None


class _Boundary:
    """The prehook of one autograd node: takes one stamp and hands it to every unit waiting on that node."""

    __slots__ = ("node", "callbacks", "_stamp", "_switch", "_fail")

    def __init__(self, node: Any, stamp: Stamp, switch: Switch, fail: Callable[[BaseException], None]) -> None:
        self.node = node
        self.callbacks: list[Callable[[Any], None]] = []
        self._stamp, self._switch, self._fail = stamp, switch, fail

    def __call__(self, grad_outputs: Any) -> None:
        if not self._switch.on:
            return
        try:
            now = self._stamp()
            for callback in self.callbacks:
                callback(now)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)


class UnitTimer:
    """Times the forward and backward of each unit and appends events to ``events``.

    Backward start: a prehook on the autograd node that produced the unit's output (the gradient has
    arrived). Backward end: a prehook on the node that produced the unit's input (the gradient of the input
    is complete, so the unit is done); for a unit whose input needs no gradient (the first one), the last
    accumulation into its parameters' ``.grad``, emitted at the iteration boundary by :meth:`flush`.
    These node hooks cost ~2.4 µs and survive in-place ops, unlike register_full_backward_hook (FIELD_NOTES).
    """

    def __init__(
        self,
        units: list[tuple[str, nn.Module]],
        events: list[tuple[Any, ...]],
        stamp: Stamp,
        lane: str,
        switch: Switch,
        fail: Callable[[BaseException], None],
    ) -> None:
        self.units = [Unit(n, m) for n, m in units]
        self._events = events
        self._sink = events.append  # list.append is atomic: autograd threads append concurrently
        self._stamp = stamp
        self._lane = lane
        self._switch = switch
        self._fail = fail
        self._handles: list[Any] = []
        self._boundaries: dict[int, _Boundary] = {}
        """Autograd node id -> its prehook, for the current iteration (holding the node keeps the id unique)."""

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def install(self) -> None:
        for unit in self.units:
            self._handles.append(unit.module.register_forward_pre_hook(self._pre_hook(unit)))
            self._handles.append(unit.module.register_forward_hook(self._post_hook(unit)))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for unit in self.units:
            for handle in unit.grad_hooks or ():
                handle.remove()
            unit.grad_hooks = None
            unit.fwd_start = unit.bwd_start = unit.last_grad = None
        self._boundaries.clear()

    def flush(self) -> None:
        """Emit the backward of units whose end is their last gradient accumulation (iteration boundary)."""
        for unit in self.units:
            if unit.bwd_start is not None and unit.last_grad is not None:
                self._sink(("compute", "backward", unit.name, self._lane, unit.bwd_start, unit.last_grad, 0))
            unit.bwd_start = unit.last_grad = None
        self._boundaries.clear()

    # The hooks below run on the training thread (forward) and on autograd threads (backward). Each one
    # catches everything: an exception must disable the shim, never reach the training loop.

    def _at_gradient_of(self, node: Any, callback: Callable[[Any], None]) -> None:
        """Call ``callback(stamp)`` when the gradient reaches ``node``: one prehook and one stamp per node.

        The node that produced block b-1's output is also block b's input: sharing the stamp makes b's
        backward end exactly where b-1's begins, so tasks on the lane never overlap.
        """
        boundary = self._boundaries.get(id(node))
        if boundary is None:
            if len(self._boundaries) >= MAX_PENDING_EVENTS:  # many forwards and no step: let go of old graphs
                self._boundaries.clear()
            boundary = self._boundaries[id(node)] = _Boundary(node, self._stamp, self._switch, self._fail)
            node.register_prehook(boundary)
        boundary.callbacks.append(callback)

    def _pre_hook(self, unit: Unit) -> Callable[..., None]:
        stamp, switch, events = self._stamp, self._switch, self._events
        on_end = self._backward_end(unit)

        def forward_pre(module: nn.Module, args: Any) -> None:
            if not switch.on or len(events) >= MAX_PENDING_EVENTS:
                return
            try:
                if not _training_forward():
                    return
                unit.last_grad = None
                inputs = 0
                for node in _grad_fns(args):
                    self._at_gradient_of(node, on_end)
                    inputs += 1
                if not inputs and unit.params and unit.grad_hooks is None:
                    self._hook_gradients(unit)
                unit.bwd_start = None
                unit.fwd_start = stamp()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

        return forward_pre

    def _post_hook(self, unit: Unit) -> Callable[..., None]:
        stamp, switch, sink, lane = self._stamp, self._switch, self._sink, self._lane
        on_start = self._backward_start(unit)
        name = unit.name

        def forward_post(module: nn.Module, args: Any, output: Any) -> None:
            if not switch.on:
                return
            try:
                start = unit.fwd_start
                if start is None:  # the pre hook saw no training forward (no grad, or a checkpoint recompute)
                    return
                sink(("compute", "forward", name, lane, start, stamp(), 0))
                unit.fwd_start = None
                for node in _grad_fns(output):
                    self._at_gradient_of(node, on_start)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

        return forward_post

    @staticmethod
    def _backward_start(unit: Unit) -> Callable[[Any], None]:
        def backward_start(stamp: Any) -> None:
            if unit.bwd_start is None:  # a unit with several outputs starts at the first gradient
                unit.bwd_start = stamp

        return backward_start

    def _backward_end(self, unit: Unit) -> Callable[[Any], None]:
        sink, lane, name = self._sink, self._lane, unit.name

        def backward_end(stamp: Any) -> None:
            start = unit.bwd_start
            if start is not None:
                sink(("compute", "backward", name, lane, start, stamp, 0))
                unit.bwd_start = None

        return backward_end

    def _hook_gradients(self, unit: Unit) -> None:
        stamp = self._stamp

        def accumulated(param: torch.Tensor) -> None:
            try:
                unit.last_grad = stamp()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

        unit.grad_hooks = [p.register_post_accumulate_grad_hook(accumulated) for p in unit.params]
