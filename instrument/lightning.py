"""DagtopCallback: ``L.Trainer(..., callbacks=[DagtopCallback()])`` times every rank of a Lightning fit with dagtop.

Importing this module imports Lightning (the callback must subclass its ``Callback``); ``import instrument`` never
does, and Lightning is an optional extra (``pip install 'dagtop[lightning]'``).

What the callback does, once the strategy has wrapped the model and built the optimizers (``on_train_start``):

- :func:`instrument.attach` on ``trainer.strategy.model``, the strategy's wrapper (DDP: every bucket's all-reduce
  is timed; others: attach says in one warning what is not), and the optimizers Lightning steps. The optimizer
  step is the iteration boundary, in automatic optimization too, where Lightning's ``step(closure)`` runs forward,
  backward and the all-reduce inside the closure: the tracer owns that boundary, not this callback.
- The loader wait, ("io", "load", "next"), around the fetch in Lightning's data fetcher.
- The host-to-device copy, ("pcie", "h2d", "to_device"), around ``transfer_batch_to_device``.
- Validation run inside the fit, as ("other", "custom", "validation"): it falls between two iterations.

Lightning's callback hooks (``on_train_batch_start`` and the like) run after both, so neither can be timed from
them; the two places chosen, and why, are described where they are installed.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection

from instrument import NullTracer, Tracer, attach
from instrument.events import COPY, LOAD, custom
from instrument.ranktracer import Granularity

__all__ = ["DagtopCallback"]


class DagtopCallback(pl.Callback):
    """Times the training of every rank: loader wait, copy, forward and backward per block, buckets, update.

    Args:
        granularity: as :func:`instrument.attach`: "block" or "layer".
        sample_every: as :func:`instrument.attach`: per-layer detail on one iteration in K.
        endpoint: where the monitor listens; default ``$DAGTOP_ENDPOINT`` or tcp://127.0.0.1:5555.

    ``DAGTOP_DISABLE=1`` leaves the fit untouched: the tracer is the no-op one and nothing is wrapped.
    """

    def __init__(self, *, granularity: Granularity = "block", sample_every: int = 0, endpoint: str | None = None) -> None:
        self._settings: dict[str, Any] = {"granularity": granularity, "sample_every": sample_every,
                                          "endpoint": endpoint}
        self.tracer: Tracer | NullTracer = NullTracer()
        """The rank's tracer once the fit has started (for ``tracer.task(...)`` in user code); a no-op one before."""
        self._undo: list[Callable[[], None]] = []
        self._validation_start = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._detach()  # a second fit with the same callback: the first's tracer is done
        # The strategy's wrapper (DDP, FSDP) is what attach needs for the collectives; Lightning hands callbacks
        # the LightningModule inside it. The optimizers are the torch ones (attach unwraps LightningOptimizer).
        self.tracer = attach(trainer.strategy.model, list(trainer.optimizers), **self._settings)
        if not self.tracer.enabled:  # DAGTOP_DISABLE=1, or attach failed and said why
            return
        self._time_fetch(trainer, self.tracer)
        self._time_copy(trainer, pl_module, self.tracer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validation_start = time.perf_counter_ns()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Validation inside a fit runs between one step and the next fetch: untimed, the next iteration would
        # charge it to "other" with no name. Before the fit's start (sanity check), and after, the tracer is idle.
        self.tracer.record(*custom("other"), "validation", self._validation_start, time.perf_counter_ns())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._detach()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._detach()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._detach()

    def _detach(self) -> None:
        """Close the tracer (it says bye to the monitor) and put back everything wrapped. Idempotent."""
        self.tracer.close()
        while self._undo:
            self._undo.pop()()

    def _time_fetch(self, trainer: pl.Trainer, tracer: Tracer | NullTracer) -> None:
        """Time each fetch of the training loop as the loader wait.

        Lightning offers no callback around a fetch. Its fetcher (``_DataFetcher.__next__``) calls two functions
        immediately around ``next()`` on the loader's iterator, so that Lightning's own profilers can time the
        fetch; the training epoch loop hands the fetcher its bound methods ``_on_before_fetch`` and
        ``_on_after_fetch`` at the start of every epoch. Instance attributes of the same names are what that
        lookup finds, so every epoch's fetcher calls the timed ones; each calls the original first (before) or
        last (after), so a profiler the user chose still sees its spans. Nothing else runs between the two
        stamps: no collation of Lightning's, no copy, no hook. The names are private: where a Lightning lacks
        them, one warning says the loader wait goes untimed.
        """
        loop = trainer.fit_loop.epoch_loop
        before = getattr(loop, "_on_before_fetch", None)
        after = getattr(loop, "_on_after_fetch", None)
        if not callable(before) or not callable(after):
            version = getattr(pl, "__version__", "?")
            warnings.warn(f"dagtop: Lightning {version} has no fetch notifications on its training loop: the loader "
                          "wait is not timed", RuntimeWarning, stacklevel=2)
            return
        now = time.perf_counter_ns
        start = 0

        def before_fetch() -> None:
            nonlocal start
            before()
            start = now()

        def after_fetch() -> None:
            end = now()
            after()
            tracer.record(*LOAD, "next", start, end)

        self._wrap(loop, "_on_before_fetch", before_fetch)
        self._wrap(loop, "_on_after_fetch", after_fetch)

    def _time_copy(self, trainer: pl.Trainer, pl_module: pl.LightningModule, tracer: Tracer | NullTracer) -> None:
        """Time ``transfer_batch_to_device`` as the copy, with the bytes of the batch's tensors.

        It is the hook Lightning moves every batch with, a user's override included, and nothing else: the
        strategy's ``batch_to_device`` around it also runs ``on_after_batch_transfer`` (often augmentation on
        the device), which is not a copy. Lightning calls the hook of the LightningModule, or of the
        DataModule when that one overrides it, looked up by name each batch: both get a timed instance
        attribute (only one is ever called). ``functools.wraps`` keeps ``__wrapped__`` pointing at the
        original, so Lightning's ``is_overridden`` still picks the same owner. Copies made while validating
        are not part of a training iteration and are not recorded.

        On a GPU the time is the host's: with Lightning's ``non_blocking`` copies from pinned memory, the
        time to enqueue them.
        """
        owners: list[Any] = [pl_module]
        datamodule = getattr(trainer, "datamodule", None)  # set by fit(datamodule=...); untyped in Lightning
        if datamodule is not None:
            owners.append(datamodule)
        now = time.perf_counter_ns
        for owner in owners:
            original = owner.transfer_batch_to_device

            @functools.wraps(original)
            def timed(batch: Any, device: Any, dataloader_idx: int, original: Any = original) -> Any:
                if not trainer.training:
                    return original(batch, device, dataloader_idx)
                start = now()
                moved = original(batch, device, dataloader_idx)
                end = now()
                tracer.record(*COPY, "to_device", start, end, nbytes=_tensor_bytes(batch))
                return moved

            self._wrap(owner, "transfer_batch_to_device", timed)

    def _wrap(self, owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        """Set ``owner.name`` as an instance attribute, and note how to put back what was there."""
        own = vars(owner)
        had, previous = name in own, own.get(name)
        object.__setattr__(owner, name, replacement)

        def undo() -> None:
            if had:
                object.__setattr__(owner, name, previous)
            else:
                own.pop(name, None)

        self._undo.append(undo)


def _tensor_bytes(batch: Any) -> int:
    """The bytes of the tensors in a batch, found as Lightning finds those it moves (collections, dataclasses)."""
    sizes: list[int] = []
    apply_to_collection(batch, torch.Tensor, lambda t: sizes.append(t.numel() * t.element_size()))
    return sum(sizes)
