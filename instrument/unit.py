"""One timed unit's state (:class:`Unit`) and what the unit timers share per autograd node: the node prehook that
stamps a backward boundary once for every unit waiting on it, and whether a node is a unit's whole backward."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from time import perf_counter_ns
from typing import TYPE_CHECKING, Final, TypeAlias

import torch
from torch import nn

from instrument.autograd import compiling, consumes
from instrument.probe import Fail, Moment, OwnTime, Removable, Stamp, Switch

if TYPE_CHECKING:
    from torch.autograd.graph import Node

    from instrument.polled import Polled


class _Marker(Enum):
    """A ``fwd_start`` that is no moment (an enum member, so that ``is`` tells mypy which it is)."""

    RECOMPUTED = 0


RECOMPUTED: Final = _Marker.RECOMPUTED
"""``Unit.fwd_start`` while backward recomputes the unit's forward (reentrant checkpointing)."""

AtMoment: TypeAlias = Callable[[Moment], None]
"""What a node's prehook hands its stamp to: a unit's backward start or end."""
Grads: TypeAlias = tuple[torch.Tensor | None, ...]
"""The gradients an autograd node's hooks are given (None where an input or output has none)."""


class Unit:
    """One timed module: its hooks and the state of its current forward/backward."""

    __slots__ = ("bwd_start", "consumes", "fwd_start", "grad_hooks", "inputs", "last_grad", "last_param", "module",
                 "name", "params", "recompute")

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.fwd_start: Moment | _Marker = None
        self.bwd_start: Moment = None
        self.last_grad: Moment = None
        self.last_param: int | None = None
        """Index in ``params`` of the parameter whose gradient was accumulated last (first backward)."""
        self.grad_hooks: list[Removable] | None = None
        self.inputs: list[Node] | None = None
        """The autograd nodes of the current forward's inputs, from the pre hook to the post hook."""
        self.consumes: dict[type, bool] = {}
        """Type of the forward's output node -> whether that node is the unit's whole backward (:func:`~instrument.autograd.consumes`)."""
        self.recompute: list[Node] | None = None
        """The nodes of the inputs of a forward that built no graph inside a training forward (a reentrant
        checkpoint runs its function under no_grad), kept until backward runs that forward again."""


def node_prehook(callbacks: list[AtMoment], stamp: Stamp, switch: Switch, fail: Fail,
                 polled: Polled | None, own: OwnTime | None = None) -> Callable[[Grads], None]:
    """The prehook of one autograd node: takes one stamp and hands it to every unit waiting on that node. On the host
    clock it is also a moment to notice the collectives that are over (``polled``, instrument/polled.py), and it adds
    its own time to ``own``."""

    def prehook(grad_outputs: Grads) -> None:
        if compiling() or not switch.on:  # compiled autograd traces the backward's hooks
            return
        began = perf_counter_ns()
        try:
            now = stamp()
            for callback in callbacks:
                callback(now)
            if polled is not None and polled.open:
                polled.poll(now)  # type: ignore[arg-type] # the host clock's moments are ints
        except Exception as exc:  # noqa: BLE001
            fail(exc)
        finally:
            if own is not None:
                own.ns += perf_counter_ns() - began

    return prehook


Boundaries = dict[int, tuple["Node", list[AtMoment]]]
"""Autograd node id -> (the node, the callbacks of its prehook)."""


def consumes_cached(unit: Unit, node: Node, inputs: list[Node]) -> bool:
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
