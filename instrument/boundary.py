"""Where one iteration ends and the next begins, told from the hooks the tracer has: :class:`IterationBoundary`.

Torch-free: the tracer's hooks report what happened (a task recorded, a step begun or ended, a backward begun, a
training forward), and the boundary calls back when an iteration is over, saying where its events end.
"""

from __future__ import annotations

from collections.abc import Callable, Sized


class IterationBoundary:
    """The iteration-boundary state machine of one rank.

    Rules:

    1. An iteration ends when ``optimizer.step()`` returns, with one optimizer: all events recorded so far are
       the iteration's (``end(None)``).
    2. With several optimizers, or when a step is skipped (GradScaler on an overflow calls no ``step()``), only
       the next training forward of the model tells that an iteration is over: it ends there. Its events are
       those recorded up to the last step's end (several optimizers: ``end(step_mark)``), or else up to the
       first loader wait or copy after the backward, which are the next iteration's (``end(load_mark)``).
    3. Under gradient accumulation a forward after a backward is the next micro-batch, not a new iteration. With
       DDP, the forward says which: a backward outside ``no_sync`` all-reduced its gradients, so a step was due
       after it. A model without DDP is due a step every as many backwards as the fewest it took to step (its
       cadence); before its first step, nothing is taken for skipped.
    4. A forward inside a step (an ``optimizer.step(closure)``) begins no iteration.
    5. On close, an iteration with a step or a backward in it ends with everything recorded (``end(None)``).

    Args:
        events: the list the hooks append to; only its length is read (where a mark falls).
        optimizers: how many optimizers step (rule 1 holds for one).
        end: called when an iteration is over, with where its events end (None: all of them). The boundary is
            reset for the next iteration when it returns.
    """

    __slots__ = ("_backward_started", "_backwards", "_cadence", "_end", "_events", "_in_step", "_load_mark",
                 "_single", "_step_mark", "_stepped", "_synced")

    def __init__(self, events: Sized, optimizers: int, end: Callable[[int | None], None]) -> None:
        self._events, self._single, self._end = events, optimizers == 1, end
        self._in_step = 0
        """Optimizer steps under way: a forward inside one (a closure's) begins no iteration."""
        self._cadence: int | None = None
        """Backwards per step (the fewest seen at a step): when a model without DDP is due one; None before."""
        self._synced: bool | None = None
        """Whether the last forward's backward all-reduces (DDP outside ``no_sync``); None without DDP."""
        self._reset()

    def _reset(self) -> None:
        self._stepped = False
        """With several optimizers: a step ended since the iteration began."""
        self._step_mark: int | None = None
        self._load_mark: int | None = None
        """Where in the events the last step ended / the first loader wait or copy after a backward began."""
        self._backwards = 0
        """Backward passes through the whole model since the iteration began (micro-batches)."""
        self._backward_started = False

    @property
    def in_step(self) -> bool:
        """An optimizer step is under way (rule 4)."""
        return self._in_step > 0

    @property
    def pending(self) -> bool:
        """The iteration under way has had a step or a backward: closing now ends it (rule 5)."""
        return self._stepped or self._backward_done()

    def task(self) -> None:
        """A task of the training thread (a loader wait, a copy, the script's own) is about to be recorded: the
        first one after a backward may be the next iteration's (rule 2)."""
        if self._load_mark is None and self._backward_done():
            self._load_mark = len(self._events)

    def step_began(self) -> None:
        self._in_step += 1

    def step_ended(self) -> None:
        """An optimizer's step returned: with one optimizer the iteration ends here (rule 1)."""
        self._in_step = max(0, self._in_step - 1)
        backwards = self._backwards + self._backward_started
        if backwards:  # a step takes at least a cycle's backwards: the fewest seen is the cycle
            self._cadence = backwards if self._cadence is None else min(self._cadence, backwards)
        if self._single:
            self.end(None)
        else:
            self._stepped = True
            self._step_mark = len(self._events)

    def backward_began(self, *_: object) -> None:
        """The backward of the whole model began (an autograd prehook on the model's output: any arguments)."""
        self._backward_started = True

    def forward_began(self, synced: bool | None) -> None:
        """A training forward of the whole model begins; ``synced``: whether its backward will all-reduce (DDP
        outside ``no_sync``), None without DDP. Past a backward with no step to end it, the iteration ends here
        (rules 2 and 3); inside a step, nothing happens (rule 4)."""
        if self._in_step:
            return
        if self._backward_started:
            self._backwards += 1
            self._backward_started = False
        if self._backwards and (self._stepped or self._step_skipped()):
            self.end(self._step_mark if self._stepped else self._load_mark)
        self._load_mark = None
        self._synced = synced

    def end(self, cut: int | None) -> None:
        """End the iteration now, its events those before ``cut`` (all if None); then begin the next."""
        self._end(cut)
        self._reset()

    def _backward_done(self) -> bool:
        return self._backwards > 0 or self._backward_started

    def _step_skipped(self) -> bool:
        """A backward that should have been followed by a step was not (a GradScaler skip, rule 3)."""
        if self._synced is not None:  # DDP: the backward all-reduced the gradients, so a step was due
            return self._synced
        return self._cadence is not None and self._backwards >= self._cadence
