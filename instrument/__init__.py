"""dagtop's training-rank shim: time the tasks of every iteration and publish them, never hurting training.

Importing the package loads the wire schema and nothing with effects: the monitor imports ``instrument.wire`` and
``instrument.events`` for the schema alone, so the shim's machinery (torch, the publisher's thread, the fork hook)
loads with the first :func:`attach`, or on first use of :class:`Tracer` or :class:`NullTracer`.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import TYPE_CHECKING, Any, Final

from instrument.wire import DEFAULT_ENDPOINT

if TYPE_CHECKING:
    from instrument.ranktracer import Granularity, NullTracer
    from instrument.tracer import Tracer

__all__ = ["DEFAULT_ENDPOINT", "NullTracer", "Tracer", "attach"]

_LAZY: Final = {"Tracer": "instrument.tracer", "NullTracer": "instrument.ranktracer"}
"""The package's names that live in modules with effects, imported when first asked for (PEP 562)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once: later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def _topology() -> tuple[int, int, int]:
    """(rank, world size, local rank): from torch.distributed if initialised, else torchrun's env, else 0/1/0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return rank, world, int(os.environ.get("LOCAL_RANK", str(rank)))


def attach(
    model: Any,
    optimizer: Any,
    *,
    granularity: Granularity = "block",
    sample_every: int = 0,
    endpoint: str | None = None,
) -> Tracer | NullTracer:
    """Instrument a model (plain or DDP-wrapped) and its optimizer; returns the rank's tracer.

    Args:
        model: the module being trained, or its DistributedDataParallel wrapper (then every bucket's
            all-reduce is timed too); or a list of them (a GAN), each model's units named after it.
        optimizer: its optimizer (or one wrapping it, as accelerate's and Lightning's do), or a list of them.
            ``step()`` is the update. With one optimizer its return ends the iteration; with several, or when
            a step is skipped (GradScaler), the next forward of the model that opens an iteration ends it.
        granularity: "block" times the model's top-level children on every iteration; "layer" times
            every leaf module with parameters on every iteration.
        sample_every: with "block", per-layer detail on one iteration in K (iterations 0, K, 2K, ...);
            0 never.
        endpoint: where the monitor listens; default ``$DAGTOP_ENDPOINT`` or tcp://127.0.0.1:5555.

    ``DAGTOP_TELEMETRY=0`` keeps the rank from sending its host and GPU telemetry (every 2 s, sampled on a
    thread of its own; see instrument/telemetry.py).

    ``DAGTOP_DISABLE=1`` returns a :class:`NullTracer` with the same calls and attributes (``device``, ``rank``,
    ``endpoint``...; :class:`~instrument.ranktracer.RankTracer`), timing nothing. If attaching fails, the
    failure is reported with one warning and a NullTracer is returned: training never stops for dagtop.
    One tracer per process: a second ``attach`` while one is open is refused the same way (its frames would
    carry the same rank and iteration numbers as the first's); attach every model at once, as lists.
    """
    from instrument import settings
    from instrument.ranktracer import GRANULARITIES, NullTracer
    from instrument.tracer import Tracer, open_tracer

    said = settings.read()
    endpoint = endpoint or said.endpoint

    def untimed() -> NullTracer:
        try:
            rank, world, local_rank = _topology()
        except Exception:  # noqa: BLE001 - an untimed rank needs no topology to train
            rank, world, local_rank = 0, 1, 0
        return NullTracer(model, rank=rank, world=world, local_rank=local_rank, endpoint=endpoint,
                          granularity=granularity, sample_every=sample_every)

    if said.disabled:
        return untimed()
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be 'block' or 'layer', not {granularity!r}")
    if sample_every < 0:
        raise ValueError("sample_every must be >= 0")
    if (current := open_tracer()) is not None:
        warnings.warn(f"dagtop: attach() was already called in this process (rank {current.rank}); this model is "
                      "not timed: pass every model and optimizer to one attach(), as lists", RuntimeWarning,
                      stacklevel=2)
        return untimed()
    try:
        from instrument.keys import check_auth

        if (unusable := check_auth()) is not None:
            warnings.warn(f"dagtop: {unusable}; training continues untimed", RuntimeWarning, stacklevel=2)
            return untimed()
        rank, world, local_rank = _topology()
        return Tracer(
            model,
            optimizer,
            rank=rank,
            world=world,
            local_rank=local_rank,
            endpoint=endpoint,
            granularity=granularity,
            sample_every=sample_every,
            heartbeat=said.heartbeat,
            telemetry=said.telemetry,
        )
    except Exception as exc:  # noqa: BLE001 - an unsupported model must not stop training
        warnings.warn(f"dagtop: could not attach ({type(exc).__name__}: {exc}); training continues untimed",
                      RuntimeWarning, stacklevel=2)
        return untimed()
