"""The unit timer (:class:`UnitTimer`): forward and backward timing of model units (blocks or layers) with module and
autograd-node hooks; grouped by granularity in instrument/timerset.py."""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING

import torch
from torch import nn

from instrument.autograd import chained, compiling, grad_enabled, grad_fns, graph_task_id, needs_grad
from instrument.compiled import CompiledCall, warn_if_backward_is_compiled
from instrument.events import BACKWARD, FORWARD, RawEvent
from instrument.probe import Moment, Probe, Removable
from instrument.unit import RECOMPUTED, AtMoment, Boundaries, Grads, Unit, consumes_cached, node_prehook

if TYPE_CHECKING:
    from torch.autograd.graph import Node

MAX_PENDING_EVENTS = 200_000
"""Forwards with gradients but no optimizer step (a validation loop without no_grad) stop being timed here."""


class UnitTimer:
    """Times the forward and backward of each unit and appends events to ``events``.

    Backward start: a prehook on the autograd node that produced the unit's output (the gradient has
    arrived). Backward end: a prehook on the node that produced the unit's input (the gradient of the input
    is complete, so the unit is done), shared with the unit before, which starts there; but where the output's
    node takes the input directly (a single-op layer) and something made before the unit also took the input
    (``main(x) + shortcut(x)``, for the shortcut: :func:`~instrument.autograd.chained`), a posthook on that
    node, not to count the other branch's backward in the layer's; for a unit whose input needs no gradient
    (the first one), the last accumulation into its parameters' ``.grad``, emitted when the unit's next forward
    begins (the next micro-batch under gradient accumulation) or at the iteration boundary by :meth:`flush`.
    These node hooks cost ~2.4 µs and survive in-place ops, unlike register_full_backward_hook (FIELD_NOTES).

    Activation checkpointing: a checkpoint's recompute is part of its unit's backward. Non-reentrant, the
    forward builds its graph as usual and backward recomputes it inside the span already timed; the recompute
    (graph task id >= 0) is not timed again. Reentrant, the forward runs under no_grad and builds no graph: it
    is timed as a forward if a graph-building forward is under way; its backward starts where the gradient
    reaches the checkpoint's output (the node that recomputes), and the rest is hooked on the graph the
    recompute builds (see :meth:`_recomputing`).

    torch.compile: no hook does anything inside a compiled region; a module compiled in place is timed
    around its compiled call (:class:`~instrument.compiled.CompiledCall`).
    """

    def __init__(self, units: list[tuple[str, nn.Module]], events: list[RawEvent], probe: Probe,
                 boundaries: Boundaries | None = None) -> None:
        self.units = [Unit(n, m) for n, m in units]
        self._events = events
        """What ``probe.sink`` appends to (list.append is atomic: autograd threads append concurrently), read for
        its length."""
        self._sink, self._stamp, self._lane = probe.sink, probe.stamp, probe.lane
        self._switch, self._fail, self._polled, self._own = probe.switch, probe.fail, probe.polled, probe.own
        self._handles: list[Removable] = []
        self._boundaries: Boundaries = {} if boundaries is None else boundaries
        """Autograd node id -> its prehook, for the current iteration (holding the node keeps the id unique);
        shared by the timers of a TimerSet, so that a node where a unit and a span meet has one stamp."""
        self._forward_open = False
        """A forward that builds a graph has begun and its backward has not: a unit's forward run without a
        graph now is part of it (reentrant checkpointing)."""
        self._recompute_start: Moment = None
        """When backward began recomputing a checkpointed segment, until a unit of it starts its backward."""
        self._ungraphed: list[tuple[object, AtMoment]] = []
        """Outputs of forwards run without a graph, with their units' backward-start callbacks, until the next
        unit's forward: a reentrant checkpoint's output gets its node once the checkpointed function returns."""

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def install(self) -> None:
        warn_if_backward_is_compiled()
        for unit in self.units:
            pre, post = self._pre_hook(unit), self._post_hook(unit)
            if getattr(unit.module, "_compiled_call_impl", None) is not None:
                self._handles.append(CompiledCall(unit.module, pre, post))
            else:
                self._handles.append(unit.module.register_forward_pre_hook(pre))
                self._handles.append(unit.module.register_forward_hook(post))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for unit in self.units:
            for handle in unit.grad_hooks or ():
                handle.remove()
            unit.grad_hooks = None
            unit.fwd_start = unit.bwd_start = unit.last_grad = unit.last_param = unit.recompute = None
        self._boundaries.clear()
        self._forward_open = False
        self._recompute_start = None
        self._ungraphed.clear()

    def flush(self) -> None:
        """Emit the backward of units whose end is their last gradient accumulation (iteration boundary)."""
        for unit in self.units:  # once per iteration per unit: the calls only where there is something to do
            if unit.bwd_start is not None or unit.last_grad is not None:
                self._emit_accumulated(unit)
            unit.recompute = None
            if unit.grad_hooks is not None and len(unit.grad_hooks) > 1:
                self._keep_last_gradient_hook(unit)
        self._boundaries.clear()
        self._forward_open = False
        self._recompute_start = None
        self._ungraphed.clear()

    def _emit_accumulated(self, unit: Unit) -> None:
        """Emit a backward that ended at the unit's last gradient accumulation, if there is one; reset."""
        if unit.bwd_start is not None and unit.last_grad is not None:
            self._sink(BACKWARD.event(unit.name, self._lane, unit.bwd_start, unit.last_grad))
        unit.bwd_start = unit.last_grad = None

    # The hooks below run on the training thread (forward) and on autograd threads (backward). Each one
    # catches everything: an exception must disable the shim, never reach the training loop.

    def _at_gradient_of(self, node: Node, callback: AtMoment) -> None:
        """Call ``callback(stamp)`` when the gradient reaches ``node``: one prehook and one stamp per node.

        The node that produced block b-1's output is also block b's input: sharing the stamp makes b's
        backward end exactly where b-1's begins, so tasks on the lane never overlap. The prehook is a closure
        over the callbacks' list (made per node per iteration: cheaper than an object).
        """
        boundary = self._boundaries.get(id(node))
        if boundary is None:
            if len(self._boundaries) >= MAX_PENDING_EVENTS:  # many forwards and no step: let go of old graphs
                self._boundaries.clear()
            callbacks: list[AtMoment] = []
            boundary = self._boundaries[id(node)] = (node, callbacks)  # holding the node keeps its id unique
            node.register_prehook(node_prehook(callbacks, self._stamp, self._switch, self._fail, self._polled,
                                               self._own))
        boundary[1].append(callback)

    def _hook_backward(self, unit: Unit, outputs: list[Node], inputs: list[Node] | None, on_start: AtMoment,
                       on_end: AtMoment, on_own_end: Callable[[Grads, Grads], None]) -> None:
        """Hook where the unit's backward starts (its outputs' nodes) and ends (see the class docstring)."""
        for node in outputs:
            self._at_gradient_of(node, on_start)
        if inputs and len(outputs) == 1 and consumes_cached(unit, outputs[0], inputs) and not (
                len(inputs) == 1 and chained(outputs[0], inputs[0])):
            outputs[0].register_hook(on_own_end)
        else:
            for node in inputs or ():
                self._at_gradient_of(node, on_end)

    def _pre_hook(self, unit: Unit) -> Callable[..., None]:
        stamp, switch, events, own = self._stamp, self._switch, self._events, self._own

        def forward_pre(module: nn.Module, args: tuple[object, ...]) -> None:
            if compiling() or not switch.on or len(events) >= MAX_PENDING_EVENTS:
                return
            began = perf_counter_ns()
            try:
                if self._ungraphed:
                    self._hook_checkpoint_outputs()
                if graph_task_id() != -1:  # backward is running a checkpoint's recompute
                    if unit.recompute is not None and grad_enabled():
                        self._recomputing(unit, args)
                    return
                if grad_enabled():
                    self._forward_open = True
                    if unit.bwd_start is not None or unit.last_grad is not None:
                        self._emit_accumulated(unit)  # the previous micro-batch's, under gradient accumulation
                    unit.recompute = None
                    unit.inputs = grad_fns(args)
                    if not unit.inputs and unit.params and unit.grad_hooks is None:
                        self._hook_gradients(unit)
                elif self._forward_open or needs_grad(args):
                    self._emit_accumulated(unit)
                    unit.recompute = grad_fns(args)  # a reentrant checkpoint's forward: no graph until backward
                else:  # no gradients and no training forward under way: evaluation
                    return
                unit.fwd_start = stamp()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
            finally:
                if own is not None:
                    own.ns += perf_counter_ns() - began

        return forward_pre

    def _recomputing(self, unit: Unit, args: tuple[object, ...]) -> None:
        """Backward runs again a forward that built no graph (reentrant checkpointing): hook the graph it builds.

        The unit's backward is then the recompute and the gradients that follow, as under non-reentrant
        checkpointing. It started at the checkpoint's output node if the unit's output was that (a block);
        else (layers inside the checkpointed function) the first unit of the segment to start its backward
        starts where the recompute started. The recompute's inputs are detached copies: where they have no
        node, the unit's backward ends at the nodes of the inputs of the forward that ran under no_grad, in the
        outer graph.
        """
        self._forward_open = False
        saved, unit.recompute = unit.recompute, None
        if self._recompute_start is None:  # the segment's first unit
            self._recompute_start = self._stamp()
        unit.inputs = grad_fns(args) or saved
        unit.fwd_start = RECOMPUTED

    def _hook_checkpoint_outputs(self) -> None:
        """Start the backward of a unit whose forward ran without a graph where its output's node runs, if the
        output has one now (it is the checkpoint's output): the recompute begins inside that node."""
        pending, self._ungraphed = self._ungraphed, []
        for output, on_start in pending:
            for node in grad_fns(output):
                self._at_gradient_of(node, on_start)

    def _post_hook(self, unit: Unit) -> Callable[..., None]:
        stamp, switch, sink, lane, own = self._stamp, self._switch, self._sink, self._lane, self._own
        category, phase = FORWARD  # the event is built in the hook: a tuple of locals, the cheapest there is
        on_start = self._backward_start(unit)
        on_recomputed_start = self._recomputed_backward_start(unit)
        on_end = self._backward_end(unit)
        on_own_end = self._own_backward_end(on_end)
        name = unit.name

        def forward_post(module: nn.Module, args: tuple[object, ...], output: object) -> None:
            if compiling() or not switch.on:
                return
            began = perf_counter_ns()
            try:
                start = unit.fwd_start
                if start is None:  # the pre hook timed nothing (evaluation, or a non-reentrant recompute)
                    return
                unit.fwd_start = None
                inputs, unit.inputs = unit.inputs, None
                if start is RECOMPUTED:
                    self._hook_backward(unit, grad_fns(output), inputs, on_recomputed_start, on_end, on_own_end)
                    return
                sink((category, phase, name, lane, start, stamp(), 0))
                if unit.recompute is None:
                    self._hook_backward(unit, grad_fns(output), inputs, on_start, on_end, on_own_end)
                else:  # no graph to hook until backward recomputes this forward; the output's node comes first
                    self._ungraphed.append((output, on_start))
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
            finally:
                if own is not None:
                    own.ns += perf_counter_ns() - began

        return forward_post

    def _backward_start(self, unit: Unit) -> AtMoment:
        def backward_start(stamp: Moment) -> None:
            self._forward_open = False
            if unit.bwd_start is None:  # a unit with several outputs starts at the first gradient
                unit.bwd_start = stamp

        return backward_start

    def _recomputed_backward_start(self, unit: Unit) -> AtMoment:
        def backward_start(stamp: Moment) -> None:
            if unit.bwd_start is None:
                begun, self._recompute_start = self._recompute_start, None
                unit.bwd_start = stamp if begun is None else begun

        return backward_start

    def _backward_end(self, unit: Unit) -> AtMoment:
        sink, lane, name = self._sink, self._lane, unit.name
        category, phase = BACKWARD

        def backward_end(stamp: Moment) -> None:
            self._recompute_start = None  # a recompute no unit started from is over: never carry it further
            start = unit.bwd_start
            if start is not None:
                sink((category, phase, name, lane, start, stamp, 0))
                unit.bwd_start = None

        return backward_end

    def _own_backward_end(self, backward_end: AtMoment) -> Callable[[Grads, Grads], None]:
        stamp, switch, own = self._stamp, self._switch, self._own

        def own_end(grad_inputs: Grads, grad_outputs: Grads) -> None:
            if switch.on and not compiling():
                began = perf_counter_ns()
                try:
                    backward_end(stamp())
                except Exception as exc:  # noqa: BLE001
                    self._fail(exc)
                finally:
                    if own is not None:
                        own.ns += perf_counter_ns() - began

        return own_end

    def _hook_gradients(self, unit: Unit) -> None:
        """Stamp each accumulation into the unit's parameters; after one backward, only the last one's."""
        stamp, own = self._stamp, self._own

        def hook(index: int) -> Callable[[torch.Tensor], None]:
            def accumulated(param: torch.Tensor) -> None:
                if compiling():
                    return
                began = perf_counter_ns()
                try:
                    unit.last_grad = stamp()
                    unit.last_param = index
                except Exception as exc:  # noqa: BLE001
                    self._fail(exc)
                finally:
                    if own is not None:
                        own.ns += perf_counter_ns() - began

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
