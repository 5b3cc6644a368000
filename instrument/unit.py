"""One timed unit's state (:class:`Unit`) and what the unit timers share per autograd node: the node prehook that
stamps a backward boundary once for every unit waiting on it, and whether a node is a unit's whole backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from instrument.autograd import compiling, consumes
from instrument.probe import Fail, Stamp, Switch


class Unit:
    """One timed module: its hooks and the state of its current forward/backward."""

    __slots__ = ("bwd_start", "consumes", "fwd_start", "grad_hooks", "inputs", "last_grad", "last_param", "module",
                 "name", "params", "recompute")

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
        self.consumes: dict[type, bool] = {}
        """Type of the forward's output node -> whether that node is the unit's whole backward (:func:`~instrument.autograd.consumes`)."""
        self.recompute: list[Any] | None = None
        """The nodes of the inputs of a forward that built no graph inside a training forward (a reentrant
        checkpoint runs its function under no_grad), kept until backward runs that forward again."""


def node_prehook(callbacks: list[Callable[[Any], None]], stamp: Stamp, switch: Switch, fail: Fail
              ) -> Callable[[Any], None]:
    """The prehook of one autograd node: takes one stamp and hands it to every unit waiting on that node."""

    def prehook(grad_outputs: Any) -> None:
        if compiling() or not switch.on:  # compiled autograd traces the backward's hooks
            return
        try:
            now = stamp()
            for callback in callbacks:
                callback(now)
        except Exception as exc:  # noqa: BLE001
            fail(exc)

    return prehook


Boundaries = dict[int, tuple[Any, list[Callable[[Any], None]]]]
"""Autograd node id -> (the node, the callbacks of its prehook)."""


def consumes_cached(unit: Unit, node: Any, inputs: list[Any]) -> bool:
    """:func:`~instrument.autograd.consumes`, worked out once per unit and type of output node (1.6 µs a call, per unit per iteration
    otherwise): a module's forward builds the same graph shape each time. An identity is still told apart."""
    for n in inputs:
        if node is n:
            return False
    kind = type(node)
    known = unit.consumes.get(kind)
    if known is None:
        known = unit.consumes[kind] = consumes(node, inputs)
    return known
