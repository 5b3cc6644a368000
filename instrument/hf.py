"""Hugging Face Trainer integration: ``Trainer(..., callbacks=[DagtopCallback()])`` times every rank's iterations.

Importing this module imports transformers (the rest of ``instrument`` never does): that import is the opt-in.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import instrument
from instrument import settings
from instrument.events import COPY, LOAD, SYNC_ON_MAIN

if TYPE_CHECKING:
    from instrument.ranktracer import Granularity, NullTracer
    from instrument.tracer import Tracer

__all__ = ["DagtopCallback"]

STACK_DEPTH: Final = 8
"""How many frames up from ``on_train_begin`` the Trainer is looked for (CallbackHandler's two frames sit between)."""

_ABSENT: Final = object()

_now = time.perf_counter_ns


class DagtopCallback(TrainerCallback):
    """Times each rank of a ``transformers.Trainer`` run and publishes it to dagtop, as ``instrument.attach`` does.

    At ``on_train_begin`` it attaches to the Trainer's DDP/FSDP wrapper and its torch optimizer: forward and
    backward per block on every micro-batch, every gradient bucket's all-reduce, the update; the optimizer's
    ``step()`` ends the iteration. It also times the Trainer's loader wait (``io``), its host-to-device copy
    (``pcie``) and, when ``average_tokens_across_devices`` gathers the token count across ranks, that collective.
    ``on_train_end`` closes the tracer. A setup it cannot time (DeepSpeed, ``nn.DataParallel``, XLA) gets one
    warning and trains untimed; with ``DAGTOP_DISABLE=1`` nothing is touched at all.

    Args:
        granularity: as for :func:`instrument.attach`: "block" or "layer".
        sample_every: as for :func:`instrument.attach`: per-layer detail on one iteration in K.
        endpoint: where the monitor listens; default ``$DAGTOP_ENDPOINT`` or tcp://127.0.0.1:5555.
    """

    def __init__(self, *, granularity: Granularity = "block", sample_every: int = 0, endpoint: str | None = None) -> None:
        self.granularity, self.sample_every, self.endpoint = granularity, sample_every, endpoint
        self.tracer: Tracer | NullTracer | None = None
        """The rank's tracer from ``on_train_begin`` to ``on_train_end``."""
        self._patches: list[tuple[Any, str, Any]] = []
        """(object, attribute, its previous instance value or _ABSENT): what on_train_end puts back."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if settings.read().disabled:  # as attach() reads it: touch nothing, say nothing
            self.tracer = instrument.NullTracer()
            return
        trainer = _calling_trainer(self)
        if trainer is None:
            # Called by something other than a Trainer's loop: time the model as handed over, and say what is missing.
            warnings.warn("dagtop: DagtopCallback found no transformers Trainer calling it: timing the model it was "
                          "handed, without its DDP wrapper, loader or copy", RuntimeWarning, stacklevel=2)
            self.tracer = self._attach(kwargs.get("model"), kwargs.get("optimizer"))
            return
        reason = _unsupported(trainer)
        if reason is not None:
            warnings.warn(f"dagtop: {reason}; training continues untimed", RuntimeWarning, stacklevel=2)
            return
        self.tracer = self._attach(trainer.model_wrapped, trainer.optimizer)
        if not self.tracer.enabled:  # attach failed, and said so
            return
        try:
            self._time_trainer(trainer, args, kwargs.get("train_dataloader"))
        except Exception as exc:  # noqa: BLE001 - a Trainer unlike the one read here must not stop training
            self._restore()
            warnings.warn(f"dagtop: could not time the Trainer's loader and copy ({type(exc).__name__}: {exc}); "
                          "the model and optimizer are still timed", RuntimeWarning, stacklevel=2)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._restore()
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None

    # ------------------------------------------------------------------ internals

    def _attach(self, model: Any, optimizer: Any) -> Tracer | NullTracer:
        return instrument.attach(model, optimizer, granularity=self.granularity,
                                 sample_every=self.sample_every, endpoint=self.endpoint)

    def _time_trainer(self, trainer: Trainer, args: TrainingArguments, loader: Any) -> None:
        """Shadow, on this Trainer instance only, the methods where it waits for its loader and copies a batch.

        The callback API has no event there (its events are per step and micro-step), so instance attributes
        call the Trainer's own methods unchanged and record the time; ``on_train_end`` removes them. Which
        batches, in which order, copied where: all stay the Trainer's.
        """
        assert self.tracer is not None
        record = self.tracer.record
        shard = ShardCopies.of(loader)
        if shard is not None:  # the copy happens inside the loader's next(): split it out there
            self._patch(shard.base, "__iter__", shard.wrap_iter)
        self._patch(trainer, "get_batch_samples",
                    lambda original: lambda it, *a, **kw: original(TimedBatches(it, record, shard), *a, **kw))
        if shard is None:  # the copy is Trainer._prepare_inputs' (or there is none: on the CPU, .to is a no-op)
            self._patch(trainer, "_prepare_inputs",
                        lambda original: timed_copy(original, record, args.device, trainer.model))
        gathers = getattr(args, "average_tokens_across_devices", False) and args.world_size > 1
        if gathers and hasattr(trainer, "_get_num_items_in_batch"):
            self._patch(trainer, "_get_num_items_in_batch", lambda original: timed_token_count(original, record))

    def _patch(self, owner: Any, name: str, wrap: Callable[[Any], Any]) -> None:
        """Set ``owner.name`` to ``wrap(owner.name)``, noting what :meth:`_restore` puts back."""
        original = getattr(owner, name)
        self._patches.append((owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, wrap(original))

    def _restore(self) -> None:
        while self._patches:
            owner, name, previous = self._patches.pop()
            if previous is _ABSENT:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, previous)


def timed_copy(prepare_inputs: Callable[[Any], Any], record: Callable[..., None], device: Any,
               model: Any) -> Callable[[Any], Any]:
    """``Trainer._prepare_inputs`` timed as the copy ("pcie", "h2d", "to_device"), with the bytes it moves.

    Only in training (``training_step`` sets ``model.train()`` first): evaluation copies its batches here too,
    and is no part of an iteration.
    """

    def prepare(inputs: Any) -> Any:
        start = _now()
        out = prepare_inputs(inputs)
        if model.training:
            record(*COPY, "to_device", start, _now(), nbytes_off(inputs, device))
        return out

    return prepare


def timed_token_count(count: Callable[..., Any], record: Callable[..., None]) -> Callable[..., Any]:
    """``Trainer._get_num_items_in_batch`` timed where it gathers the step's token count from every rank.

    That gather is a collective on the training thread: a rank that loaded its batches late keeps the others
    waiting there, so it is timed like DDP's buffer broadcast, ("allreduce", "custom", ...) on the main lane.
    """

    def num_items_in_batch(*args: Any, **kwargs: Any) -> Any:
        start = _now()
        out = count(*args, **kwargs)
        if out is not None:  # None: nothing to count, and no gather
            record(*SYNC_ON_MAIN, "trainer.num_items_in_batch", start, _now(), nbytes_of(out))
        return out

    return num_items_in_batch


def _calling_trainer(callback: DagtopCallback) -> Trainer | None:
    """The Trainer whose loop is calling ``callback`` now, found on the call stack.

    Callbacks are handed the unwrapped ``model`` (``Trainer.model``), the optimizer and the loaders, never the
    Trainer nor ``Trainer.model_wrapped``, which alone holds the DDP/FSDP wrapper that accelerate built; nothing
    else reaches it either (accelerate's ``Accelerator._models`` has no global handle, and the wrapped module has
    no reference back to its wrapper). But ``CallbackHandler`` calls every callback from the Trainer's own method
    (``_inner_training_loop``), whose ``self`` is the Trainer: read once, at train begin, and checked to be the
    Trainer that holds this callback, that is exact. The alternatives are worse: a garbage-collector search for
    whatever refers to the model scans every object, and DDP's private ``_active_ddp_module`` is set only inside
    a forward, after the first blocks have run.
    """
    frame: FrameType | None = sys._getframe(1)
    try:
        for _ in range(STACK_DEPTH):
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer) and any(cb is callback for cb in candidate.callback_handler.callbacks):
                return candidate
            frame = frame.f_back
        return None
    finally:
        del frame  # a frame held from a local is a reference cycle


def _unsupported(trainer: Trainer) -> str | None:
    """Why this Trainer's setup cannot be timed, or None."""
    import torch

    if getattr(trainer, "is_deepspeed_enabled", False):
        return "DeepSpeed is not supported (its engine runs its own optimizer step and collectives)"
    if getattr(trainer, "is_fsdp_xla_enabled", False):
        return "FSDP on XLA is not supported"
    if trainer.args.n_gpu > 1:
        return "nn.DataParallel (several GPUs in one process) is not supported: run one process per GPU"
    if not isinstance(trainer.model_wrapped, torch.nn.Module):
        return f"the Trainer's model is a {type(trainer.model_wrapped).__name__}, not a torch module"
    return None


def nbytes_of(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or tuples, lists and dicts of them, three levels deep)."""
    return nbytes_off(value, None)


def nbytes_off(value: Any, device: Any, depth: int = 0) -> int:
    """Bytes of the tensors in ``value`` that are not on ``device`` (all of them if it is None): what ``.to`` copies."""
    import torch

    if isinstance(value, torch.Tensor):
        return 0 if device is not None and value.device == device else value.numel() * value.element_size()
    if depth < 3 and isinstance(value, (tuple, list)):
        return sum(nbytes_off(v, device, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return sum(nbytes_off(v, device, depth + 1) for v in value.values())
    return 0


class ShardCopies:
    """Times the loads of an accelerate ``DataLoaderShard`` that copies its batches to an accelerator.

    With device placement (the Trainer's default), ``DataLoaderShard.__iter__`` runs, in each ``next()`` it
    answers: ``send_to_device`` of the batch it returns, then the next ``next()`` of its base DataLoader (it
    reads one ahead; the first call also loads the first batch). Stamping the base loader's ``next()`` splits
    that ``next()`` into the copy (before the last base ``next()``) and the loads (see :func:`split_next`).
    Read from accelerate 1.15's data_loader.py; only an exact ``DataLoaderShard`` is split.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self.spans: list[tuple[int, int]] = []
        """(start, end) of each base ``next()`` during the current outer ``next()``."""

    @classmethod
    def of(cls, loader: Any, *, on_cpu: bool = False) -> ShardCopies | None:
        """A splitter for ``loader`` if it is a DataLoaderShard placing batches on a device (not the CPU unless
        ``on_cpu``: there ``send_to_device`` copies nothing, and the Trainer's ``_prepare_inputs`` is timed)."""
        try:
            from accelerate.data_loader import DataLoaderShard
        except ImportError:
            return None
        if type(loader) is not DataLoaderShard or getattr(loader, "base_dataloader", None) is None:
            return None
        device = getattr(loader, "device", None)
        if device is None or (str(device).startswith("cpu") and not on_cpu):
            return None
        return cls(loader.base_dataloader)

    def wrap_iter(self, base_iter: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
        """The base loader's ``__iter__`` stamping each ``next()``: an instance attribute, which DataLoaderShard
        finds because it calls ``self.base_dataloader.__iter__()`` by name."""
        return lambda: self._stamped(base_iter())

    def _stamped(self, it: Iterator[Any]) -> Iterator[Any]:
        spans = self.spans
        while True:
            start = _now()
            try:
                item = next(it)
            except StopIteration:
                return
            spans.append((start, _now()))
            yield item


def split_next(start: int, end: int, spans: list[tuple[int, int]]) -> list[tuple[str, str, str, int, int]]:
    """The tasks of one ``next()`` of a DataLoaderShard, [start, end], given its base loader's ``next()`` spans.

    The copy runs just before the last base ``next()`` (the look-ahead), after the one before it if any; the
    rest is loading. With no base ``next()`` (the last batch, already loaded), the whole call is the copy.
    Returns (category, phase, name, start, end) tuples in order, never overlapping.
    """
    if not spans:
        return [(*COPY, "to_device", start, end)]
    last = spans[-1][0]
    copy_start = spans[-2][1] if len(spans) > 1 else start
    tasks = [(*LOAD, "next", start, copy_start)] if copy_start > start else []
    tasks.append((*COPY, "to_device", copy_start, last))
    tasks.append((*LOAD, "next", last, end))
    return tasks


class TimedBatches:
    """The Trainer's epoch iterator as ``get_batch_samples`` reads it: each ``next()`` is the loader wait."""

    __slots__ = ("_first", "_inner", "_record", "_shard")

    def __init__(self, inner: Iterator[Any], record: Callable[..., None], shard: ShardCopies | None) -> None:
        self._inner, self._record, self._shard = inner, record, shard
        self._first = True

    def __iter__(self) -> TimedBatches:
        return self

    def __next__(self) -> Any:
        shard = self._shard
        if shard is not None:
            shard.spans.clear()
        start = _now()
        item = next(self._inner)  # StopIteration: the epoch is over, nothing to record
        end = _now()
        if shard is not None and self._first and not shard.spans:
            # The first next() of a DataLoaderShard reads its first batch: none read means another loader
            # (a resumed epoch iterates a new one, made by skip_first_batches). Its next() is all loading.
            self._shard = shard = None
        self._first = False
        if shard is None:
            self._record(*LOAD, "next", start, end)
        else:
            size = nbytes_of(item)
            for category, phase, name, s, e in split_next(start, end, shard.spans):
                self._record(category, phase, name, s, e, size if category == "pcie" else 0)
        return item
