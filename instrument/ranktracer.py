"""What a training script holds after ``attach()``: the :class:`RankTracer` protocol, which the timing
:class:`~instrument.tracer.Tracer` and the inert :class:`NullTracer` both implement in full, so that a script
written against one runs unchanged under ``DAGTOP_DISABLE=1``."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from instrument.batch import move
from instrument.wire import DEFAULT_ENDPOINT
from instrument.wiring import model_device

if TYPE_CHECKING:
    import torch

Granularity = Literal["block", "layer"]
"""``block``: the model's top-level children on every iteration; ``layer``: every leaf module with parameters."""
GRANULARITIES: tuple[Granularity, ...] = ("block", "layer")


@runtime_checkable
class RankTracer(Protocol):
    """One rank's tracer: what it times and where it sends it, and the calls a training loop makes.

    A context manager: ``with instrument.attach(model, optimizer) as tracer:`` closes it on the way out.
    """

    rank: int
    world: int
    local_rank: int
    endpoint: str
    """Where the monitor listens."""
    granularity: Granularity
    sample_every: int
    """With ``block``: per-layer detail on one iteration in K; 0 never."""
    iteration: int
    """The iteration under way, counted from 0."""

    @property
    def device(self) -> torch.device:
        """Where the model trains (its first parameter's device): where batches go."""
        ...

    @property
    def enabled(self) -> bool:
        """Whether it is timing now."""
        ...

    def loader(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """``iterable``, each ``next()`` timed as the loader's wait."""
        ...

    def to_device(self, batch: Any, device: torch.device | str) -> Any:
        """``batch``'s tensors copied to ``device``, the copy timed."""
        ...

    def task(self, name: str, category: str = "other") -> AbstractContextManager[None]:
        """A ``with`` block timed as a task of the script's own."""
        ...

    def record(self, category: str, phase: str, name: str, start_ns: int, end_ns: int, nbytes: int = 0,
               lane: str = "main") -> None:
        """A task timed elsewhere (a framework's callbacks), added to the iteration under way."""
        ...

    def close(self) -> None:
        """Stop timing and say goodbye to the monitor; idempotent."""
        ...

    def __enter__(self) -> RankTracer: ...  # noqa: PYI034 - typing.Self is 3.11+, the shim runs on 3.10

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...


class Closing:
    """``with attach(...) as tracer:``: the tracer, closed on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class NullTracer(Closing):
    """What attach() returns with ``DAGTOP_DISABLE=1`` (or after a failure): the same calls and attributes as
    :class:`Tracer` (:class:`~instrument.ranktracer.RankTracer`), no timing. Its ``device`` is the model's."""

    iteration = 0
    enabled = False

    def __init__(self, model: Any = None, *, rank: int = 0, world: int = 1, local_rank: int = 0,
                 endpoint: str = DEFAULT_ENDPOINT, granularity: Granularity = "block",
                 sample_every: int = 0) -> None:
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.endpoint, self.granularity, self.sample_every = endpoint, granularity, sample_every
        self._model = model

    @functools.cached_property
    def device(self) -> torch.device:
        """The model's device (the CPU without a model): asked for, not at attach, so torch loads only if used."""
        return model_device(self._model)

    def loader(self, iterable: Iterable[Any]) -> Iterable[Any]:
        return iterable

    def to_device(self, batch: Any, device: torch.device | str) -> Any:
        return move(batch, device)[0]

    def task(self, name: str, category: str = "other") -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def record(self, category: str, phase: str, name: str, start_ns: int, end_ns: int, nbytes: int = 0,
               lane: str = "main") -> None:
        pass

    def close(self) -> None:
        pass
