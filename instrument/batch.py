"""What the training thread does between the model's hooks: batches mapped or moved to a device (their bytes
counted), the loader's wait for each one timed, and the script's own tasks timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from instrument.events import CATEGORIES, LOAD, custom
from instrument.wire_fields import MAX_NAME_CHARS

if TYPE_CHECKING:
    import torch

    from instrument.tracer import Tracer


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` (a tensor, or tuples, namedtuples, lists and dicts of them) with ``fn`` applied to each tensor."""
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (tuple, list)):
        items = [map_tensors(item, fn) for item in batch]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
            return type(batch)(*items)
        return type(batch)(items)
    if isinstance(batch, dict):
        return {key: map_tensors(item, fn) for key, item in batch.items()}
    return batch


def move(batch: Any, device: torch.device | str, non_blocking: bool = False) -> tuple[Any, int]:
    """Copy the tensors of ``batch`` to ``device`` (see :func:`map_tensors`); count their bytes."""
    sizes: list[int] = []

    def to(tensor: torch.Tensor) -> torch.Tensor:
        sizes.append(tensor.numel() * tensor.element_size())
        return tensor.to(device, non_blocking=non_blocking)

    return map_tensors(batch, to), sum(sizes)


class TimedLoader:
    """Wraps an iterable; times each ``next()``: the wait the training loop sees."""

    def __init__(self, tracer: Tracer, iterable: Iterable[Any]) -> None:
        self._tracer = tracer
        self._iterable = iterable
        tracer._loading = None

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._iterable)
        now, cpu = time.perf_counter_ns, time.thread_time_ns
        tracer = self._tracer
        share = tracer._wait_share
        category, phase = LOAD
        while True:
            start = tracer._loading = now()
            used = cpu()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                tracer._loading = None
            if tracer._on:
                end = now()
                tracer._main_task((category, phase, "next", "main", start, end, 0))
                used = cpu() - used
                share.add(used, end - start)
                if tracer._cpu is not None:
                    tracer._cpu.load += used
            yield item


class TimedTask:
    """A task of the script's own (``tracer.task``): times a ``with`` block on the training thread."""

    __slots__ = ("_kind", "_name", "_start", "_tracer")

    def __init__(self, tracer: Tracer, name: str, category: str) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {', '.join(CATEGORIES)}")
        self._tracer, self._name, self._kind, self._start = tracer, name[: MAX_NAME_CHARS], custom(category), 0

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        if self._tracer._on:
            self._tracer._main_task(self._kind.event(self._name, "main", self._start, time.perf_counter_ns()))
