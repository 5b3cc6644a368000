"""What the shim reads of autograd's graph: the nodes behind a module's input or output, whether a node is a
unit's whole backward, and the flags hooks test first (grad mode, a backward's recompute, a compiled region)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.autograd.graph import Node

grad_enabled = torch.is_grad_enabled
graph_task_id = torch._C._current_graph_task_id
"""-1 outside backward; the running graph task's id (>= 0) when backward runs a checkpoint's recompute."""
compiling = torch.compiler.is_compiling
"""True while Dynamo traces: a hook that finds itself in a compiled region returns at once. Dynamo folds the
test to a constant, so the hook leaves no trace in the graph (a timestamp there would be a graph break)."""


def grad_fns(value: object) -> list[Node]:
    """The autograd nodes that produced the tensors of a module's input or output (tensor, tuple, list, dict).

    Runs twice per timed module per iteration: the common shapes (a 1-tuple of args, a tensor) come first.
    """
    if type(value) is tuple and len(value) == 1 and isinstance(value[0], torch.Tensor):
        node = value[0].grad_fn
        return [] if node is None else [node]
    if isinstance(value, torch.Tensor):
        node = value.grad_fn
        return [] if node is None else [node]
    nodes: list[Node] = []
    _collect(value, nodes, 0)
    return nodes


def _collect(value: object, nodes: list[Node], depth: int) -> None:
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None and all(value.grad_fn is not n for n in nodes):
            nodes.append(value.grad_fn)
    elif depth < 2 and isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, nodes, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for item in value.values():
            _collect(item, nodes, depth + 1)


def needs_grad(value: object) -> bool:
    """True if a tensor of a module's input (tensor, tuple, list) requires gradients."""
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    return isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) and v.requires_grad for v in value)


_AccumulateGrad = torch._C._functions.AccumulateGrad  # type: ignore[attr-defined]  # not in the stubs
"""The type of a parameter's leaf node, where its gradient is accumulated."""


def consumes(node: Node, inputs: list[Node]) -> bool:
    """True if ``node``, a unit's output node, is the unit's whole backward: it takes the unit's input directly
    and otherwise only parameters (a single-op layer).

    Then the unit's backward ends when that node has run (a posthook), not when its input's gradient is
    complete: in a residual block the input is shared with the other branch, whose backward that would add.
    A node that also takes another branch (``x + f(x)``) is not the whole backward: the input's node is.
    """
    takes_input = False
    for child, _ in node.next_functions:
        if child is None:
            continue
        if any(child is i for i in inputs):
            takes_input = True
        elif not parameter(child):
            return False
    return takes_input and not any(node is n for n in inputs)  # an identity: the output is the input


def chained(node: Node, input_node: Node) -> bool:
    """True if no autograd node was made between a unit's input node and ``node``, its output node, but ``node``'s
    own parameter-side ops (a weight's transpose): where :func:`consumes` holds, the input then has no consumer
    made before the unit, whose backward would run after the unit's and before the input's gradient is complete
    (consumers made later run before it: the engine runs the ready node made last first).

    Then the unit's backward ends where the gradient reaches its input, a moment the unit before it stamps anyway
    (its backward starts there): the posthook on ``node`` is not needed. Read from the nodes' sequence numbers,
    which the forward hands out one by one; a parameter's leaf node takes none.
    """
    first, last = input_node._sequence_nr(), node._sequence_nr()
    own = 0
    for child, _ in node.next_functions:
        if child is None or child is input_node or type(child) is _AccumulateGrad:
            continue
        if not first < child._sequence_nr() < last:
            return False
        own += 1
    return last - first - 1 == own


def parameter(node: Node) -> bool:
    """A parameter's leaf node, or one op on one (a weight's transpose)."""
    if type(node) is _AccumulateGrad:
        return True
    children = node.next_functions
    return len(children) == 1 and type(children[0][0]) is _AccumulateGrad
