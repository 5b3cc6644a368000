"""Forward and backward timing of model units (blocks or layers) with module and autograd-node hooks."""

from __future__ import annotations

from collections.abc import Callable
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


DOMINANT_SHARE = 0.8
"""A child holding this share of its parent's parameters is the model (HF's ``*ForCausalLM`` around its
transformer): its children are the blocks, beside the parent's other children (the head)."""


def compiled(module: nn.Module) -> bool:
    """True for a module whose call Dynamo traces: ``torch.compile(m)`` or ``m.compile()``.

    A hook inside a compiled region splits the graph (Dynamo cannot trace a timestamp), so units stop at
    a compiled module: hooks go on its eager wrapper, never inside it.
    """
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


def model_name(module: nn.Module) -> str:
    """The class name of a model: a compiled or DDP-wrapped one is named after the model inside."""
    inner = getattr(module, "_orig_mod", module)
    if type(inner).__name__ == "DistributedDataParallel":
        inner = inner.module
    return type(inner).__name__


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _called_children(node: nn.Module) -> list[nn.Module]:
    """The children of ``node``, a ModuleList/ModuleDict replaced by its items: containers are never called."""
    out: list[nn.Module] = []
    for child in node.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out.extend(_called_children(child))
        else:
            out.append(child)
    return out


def block_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks of a model: its top-level children, seen through thin wrappers and containers.

    Descends while there is exactly one child, and into a child that holds most of the parameters
    (``DOMINANT_SHARE``), keeping that child's siblings as blocks. Never descends into a compiled module.
    """
    names = {id(m): n for n, m in root.named_modules()}
    node = root
    while not compiled(node):
        children = _called_children(node)
        if len(children) != 1:
            break
        node = children[0]
    if compiled(node) or not (children := _called_children(node)):
        return [(names[id(node)] or model_name(node), node)]
    while True:
        total = _param_count(node)
        dominant = next((c for c in children if not compiled(c) and _called_children(c) and total
                         and _param_count(c) >= DOMINANT_SHARE * total), None)
        if dominant is None:
            break
        at = children.index(dominant)
        node, children = dominant, children[:at] + _called_children(dominant) + children[at + 1:]
    return [(names[id(c)], c) for c in children]


def layer_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers of a model: the leaf modules that own trainable parameters; a compiled module is a leaf."""
    units: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()

    def visit(name: str, module: nn.Module) -> None:
        if id(module) in seen:  # a module used twice is hooked once, as named_modules() lists it once
            return
        seen.add(id(module))
        if compiled(module):
            units.append((name or model_name(module), module))
            return
        children = list(module.named_children())
        if not children and any(p.requires_grad for p in module.parameters(recurse=False)):
            units.append((name or type(module).__name__, module))
        for child_name, child in children:
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", root)
    return units or block_units(root)


class Unit:
    """One timed module: its hooks and the state of its current forward/backward."""

    __slots__ = ("bwd_start", "fwd_start", "grad_hooks", "inputs", "last_grad", "last_param", "module", "name",
                 "params")

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.fwd_start: Any = None
        self.bwd_start: Any = None
        self.last_grad: Any = None
        self.last_param: int | None = None
        """Index in ``params`` of the parameter whose gradient was accumulated last (first backward)."""
        self.grad_hooks: list[Any] | None = None
        self.inputs: list[Any] | None = None
        """The autograd nodes of the current forward's inputs, from the pre hook to the post hook."""


class _Boundary:
    """The prehook of one autograd node: takes one stamp and hands it to every unit waiting on that node."""

    __slots__ = ("_fail", "_stamp", "_switch", "callbacks", "node")

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


def _consumes(node: Any, inputs: list[Any]) -> bool:
    """True if ``node``, a unit's output node, takes the unit's input directly: it is the unit's whole backward.

    Then the unit's backward ends when that node has run (a posthook), not when its input's gradient is
    complete: in a residual block the input is shared with the other branch, whose backward that would add.
    """
    if any(node is n for n in inputs):  # an identity: the output is the input
        return False
    return any(n is not None and any(n is i for i in inputs) for n, _ in node.next_functions)


class UnitTimer:
    """Times the forward and backward of each unit and appends events to ``events``.

    Backward start: a prehook on the autograd node that produced the unit's output (the gradient has
    arrived). Backward end: where the output's node takes the input directly (a single-op layer), a posthook
    on that node; otherwise a prehook on the node that produced the unit's input (the gradient of the input
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
            unit.fwd_start = unit.bwd_start = unit.last_grad = unit.last_param = None
        self._boundaries.clear()

    def flush(self) -> None:
        """Emit the backward of units whose end is their last gradient accumulation (iteration boundary)."""
        for unit in self.units:
            if unit.bwd_start is not None and unit.last_grad is not None:
                self._sink(("compute", "backward", unit.name, self._lane, unit.bwd_start, unit.last_grad, 0))
            unit.bwd_start = unit.last_grad = None
            self._keep_last_gradient_hook(unit)
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

        def forward_pre(module: nn.Module, args: Any) -> None:
            if not switch.on or len(events) >= MAX_PENDING_EVENTS:
                return
            try:
                if not _training_forward():
                    return
                unit.last_grad = None
                unit.inputs = _grad_fns(args)
                if not unit.inputs and unit.params and unit.grad_hooks is None:
                    self._hook_gradients(unit)
                unit.bwd_start = None
                unit.fwd_start = stamp()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)

        return forward_pre

    def _post_hook(self, unit: Unit) -> Callable[..., None]:
        stamp, switch, sink, lane = self._stamp, self._switch, self._sink, self._lane
        on_start = self._backward_start(unit)
        on_end = self._backward_end(unit)
        on_own_end = self._own_backward_end(on_end)
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
                outputs = _grad_fns(output)
                for node in outputs:
                    self._at_gradient_of(node, on_start)
                inputs, unit.inputs = unit.inputs, None
                if inputs and len(outputs) == 1 and _consumes(outputs[0], inputs):
                    outputs[0].register_hook(on_own_end)
                else:
                    for node in inputs or ():
                        self._at_gradient_of(node, on_end)
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

    def _own_backward_end(self, backward_end: Callable[[Any], None]) -> Callable[[Any, Any], None]:
        stamp, switch = self._stamp, self._switch

        def own_end(grad_inputs: Any, grad_outputs: Any) -> None:
            if switch.on:
                try:
                    backward_end(stamp())
                except Exception as exc:  # noqa: BLE001
                    self._fail(exc)

        return own_end

    def _hook_gradients(self, unit: Unit) -> None:
        """Stamp each accumulation into the unit's parameters; after one backward, only the last one's."""
        stamp = self._stamp

        def hook(index: int) -> Callable[[torch.Tensor], None]:
            def accumulated(param: torch.Tensor) -> None:
                try:
                    unit.last_grad = stamp()
                    unit.last_param = index
                except Exception as exc:  # noqa: BLE001
                    self._fail(exc)

            return accumulated

        unit.grad_hooks = [p.register_post_accumulate_grad_hook(hook(i)) for i, p in enumerate(unit.params)]

    @staticmethod
    def _keep_last_gradient_hook(unit: Unit) -> None:
        # A whole compiled model is one unit with hundreds of parameters: a stamp per accumulation would
        # cost more than everything else dagtop does. The order is the graph's, so one backward tells.
        hooks = unit.grad_hooks
        if hooks is None or len(hooks) < 2 or unit.last_param is None:
            return
        for i, handle in enumerate(hooks):
            if i != unit.last_param:
                handle.remove()
        unit.grad_hooks = [hooks[unit.last_param]]
