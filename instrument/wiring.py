"""What ``attach()`` wires the tracer to: the torch optimizers behind the one given, the model behind its DDP or
compiled wrapper, the units and spans of each model and their timers (:func:`wire_models`), the device it trains
on, and the job's collectives."""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from instrument.probe import OwnTime, Probe

if TYPE_CHECKING:
    import torch
    from torch import nn

    from instrument.collectives import ScriptCollectives
    from instrument.comm import BucketTimer
    from instrument.cuda import CudaTiming
    from instrument.events import RawEvent
    from instrument.probe import Fail, Removable, Stamp, Switch
    from instrument.timerset import TimerSet

UnitFinder = Callable[["nn.Module"], list[tuple[str, "nn.Module"]]]
"""``block_units`` or ``layer_units`` (instrument/units.py): a model's timed units, by name."""


def model_device(model: Any) -> torch.device:
    """Where ``model`` (a module, its DDP or compiled wrapper, a list of them: the first; None) keeps its first
    parameter; the CPU without one."""
    import torch

    first_model = (model[0] if model else None) if isinstance(model, (list, tuple)) else model
    first = next(first_model.parameters(), None) if first_model is not None and hasattr(first_model, "parameters") \
        else None
    return first.device if first is not None else torch.device("cpu")


def optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers behind ``optimizer``: one, a list of them, or wrappers (accelerate's
    ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) whose ``step()`` calls the torch one's."""
    items = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    if not items:
        raise ValueError("no optimizer given")
    unwrapped = []
    for opt in items:
        while not hasattr(opt, "_optimizer_step_pre_hooks"):  # a torch Optimizer's, set by its __init__
            inner = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
            if inner is None or inner is opt:
                raise TypeError(f"{type(opt).__name__} is not a torch optimizer and wraps none")
            opt = inner
        unwrapped.append(opt)
    return unwrapped


def describe_units(names: list[str]) -> str:
    """``6 blocks: embed, layers.0…3, head``: numbered runs of one prefix (a ModuleList's members) folded."""
    parts: list[str] = []
    run: tuple[str, int, int] | None = None  # prefix, first, last
    for name in [*names, ""]:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if run is not None and match and match[1] == run[0] and int(match[2]) == run[2] + 1:
            run = (run[0], run[1], int(match[2]))
            continue
        if run is not None:
            prefix, first, last = run
            parts.append(f"{prefix}{first}" if first == last else f"{prefix}{first}…{last}")
        run = (match[1], int(match[2]), int(match[2])) if match else None
        if not match and name:
            parts.append(name)
    return f"{len(names)} block{'s' * (len(names) != 1)}: {', '.join(parts)}"


def units_of(find: UnitFinder, modules: list[nn.Module]) -> list[tuple[str, nn.Module]]:
    """``find``'s units of each model; with several models, each unit's name begins with its model's."""
    if len(modules) == 1:
        return list(find(modules[0]))
    return [(f"{prefix}.{name}", unit) for prefix, m in zip(_prefixes(modules), modules) for name, unit in find(m)]


def spans_of(find: UnitFinder, modules: list[nn.Module]) -> list[list[tuple[str, nn.Module]]]:
    """The span levels around ``find``'s units of each model (instrument/spans.py), named as :func:`units_of`
    names the units; the models are disjoint, so their levels of one depth are one level."""
    from instrument.units import span_levels

    if len(modules) == 1:
        return span_levels(modules[0], find(modules[0]))
    levels: list[list[tuple[str, nn.Module]]] = []
    for prefix, m in zip(_prefixes(modules), modules):
        for depth, level in enumerate(span_levels(m, find(m), prefix)):
            if depth == len(levels):
                levels.append([])
            levels[depth].extend(level)
    return levels


def _prefixes(modules: list[nn.Module]) -> list[str]:
    """Each model's name, numbered where two are of one class."""
    from instrument.units import model_name

    names = [model_name(m) for m in modules]
    return [f"{n}{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def unwrap(model: nn.Module) -> tuple[torch.nn.parallel.DistributedDataParallel | None, nn.Module]:
    """(the DDP wrapper or None, the module whose units are timed) for a plain, DDP or compiled model.

    ``torch.compile(DDP(m))`` keeps its DDP under ``_orig_mod``: the bucket timer goes there, the timing
    hooks on the compiled wrapper, outside the region Dynamo traces.
    """
    import torch

    ddp_type = torch.nn.parallel.DistributedDataParallel
    if isinstance(model, ddp_type):
        return model, model.module
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, ddp_type):
        return inner, model
    return None, model


def is_cuda(device: object) -> bool:
    """Whether ``device`` (a ``torch.device`` or its name) is a GPU."""
    return str(device).startswith("cuda")


def as_device(device: torch.device | str) -> torch.device:
    """``device`` as a ``torch.device``."""
    import torch

    return torch.device(device)


@dataclass
class Collectives:
    """What :func:`time_collectives` set up."""

    buckets: BucketTimer | None = None
    """DDP's gradient buckets' all-reduces."""
    script: ScriptCollectives | None = None
    """The script's own collectives (``dist.all_reduce``, ``dist.barrier``...)."""
    handles: list[Removable] = field(default_factory=list)
    """What the tracer removes when it stops."""


def time_collectives(ddp: torch.nn.parallel.DistributedDataParallel | None, modules: list[nn.Module], rank: int,
                     world: int, probe: Probe, iteration: Callable[[], int]) -> Collectives:
    """Time the job's collectives on the ``comm`` lane of ``probe``: DDP's buckets (and its buffer broadcast, on
    the main lane), else FSDP2's all-gathers and reduce-scatters; and beside either, the script's own.

    Called by the tracer's ``_install`` (``stacklevel`` 5 is the caller of ``attach()``).
    """
    out = Collectives()
    shards = None
    if ddp is not None:
        import time

        from instrument.buffer_sync import time_buffer_sync
        from instrument.comm import BucketTimer

        time_buffer_sync(ddp, probe.on_lane("main", time.perf_counter_ns))
        try:
            out.buckets = BucketTimer(ddp, probe.on_lane("comm"))
        except Exception as exc:  # noqa: BLE001 - a torch without the reducer's process-group swap
            warnings.warn(f"dagtop: DDP's gradient all-reduces are not timed on this torch ({exc}); "
                          "their time counts as untimed", RuntimeWarning, stacklevel=5)
    elif world > 1:
        from instrument.fsdp import ShardTimer, untimed

        # fully_shard (FSDP2): all-gathers, reduce-scatters (and HSDP's all-reduce) through FSDP's own API.
        shards = ShardTimer.of(modules, probe.on_lane("comm"), iteration)
        if shards is not None:
            out.handles.append(shards)  # its remove() gives FSDP back the comms it held
        reason = untimed(modules, shards)
        if reason:
            warnings.warn(f"dagtop: rank {rank} of {world} {reason}", RuntimeWarning, stacklevel=5)
    if ddp is not None or shards is not None:
        from instrument.collectives import ScriptCollectives

        # The script's own all_reduce, barrier... as collectives across ranks, beside DDP's or FSDP's.
        out.script = ScriptCollectives(probe.on_lane("comm"), iteration)
        out.handles.append(out.script)  # its remove() gives torch.distributed its functions back
    return out


@dataclass
class Models:
    """The models given to ``attach()``, unwrapped, and the timers of their units (:func:`wire_models`)."""

    given: list[nn.Module]
    """As given: their top forward opens and closes iterations."""
    modules: list[nn.Module]
    """Each one behind its DDP or compiled wrapper."""
    ddp: torch.nn.parallel.DistributedDataParallel | None
    """The first model's DDP: its collectives are timed."""
    ddp_of: dict[int, torch.nn.parallel.DistributedDataParallel | None]
    """``id()`` of a model as given → its DDP, if any."""
    device: torch.device
    cuda: CudaTiming | None
    """Timing on the CUDA stream, for a CUDA model."""
    stamp: Stamp
    """CUDA events on the stream, else ``perf_counter_ns``."""
    lane: str
    """Where the compute runs: ``gpu`` or ``main``."""
    probe: Probe
    """The compute lane's probe."""
    blocks: TimerSet
    layers: TimerSet
    """The units' timers: blocks, or per layer on detailed iterations."""
    units_said: str
    """The units as the hello describes them."""
    params: int
    name: str


def wire_models(model: Any, events: list[RawEvent], switch: Switch, fail: Fail) -> Models:
    """Unwrap ``model`` (one or a list), find its device, and build the timers of its blocks and layers, their
    events appended to ``events`` (nothing is hooked yet: :meth:`TimerSet.install`).

    Called by the tracer's ``_install`` (``stacklevel`` 5 is the caller of ``attach()``).
    """
    from instrument.polled import Polled
    from instrument.timerset import TimerSet
    from instrument.units import block_units, layer_units, model_name

    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not models:
        raise ValueError("no model given")
    unwrapped = [unwrap(m) for m in models]
    if sum(d is not None for d, _ in unwrapped[1:]):
        warnings.warn("dagtop: several models in DistributedDataParallel: only the first one's gradient buckets "
                      "are timed (their names would collide); the others' all-reduces count as untimed time",
                      RuntimeWarning, stacklevel=5)
    device = model_device(unwrapped[0][1])
    cuda: CudaTiming | None = None
    if device.type == "cuda":
        from instrument.cuda import CudaTiming

        cuda = CudaTiming(device)
    # NCCL's futures complete at enqueue, so a CUDA job times its collectives on the stream too.
    stamp = cuda.stamp if cuda is not None else time.perf_counter_ns
    lane = "gpu" if cuda is not None else "main"
    # On the host clock the training thread notices when a collective is over (instrument/polled.py), and the
    # hooks count their own time, which the steps of a CPU rank include.
    probe = (Probe(events.append, stamp, lane, switch, fail) if cuda is not None
             else Probe(events.append, stamp, lane, switch, fail, Polled(fail), OwnTime()))
    modules = [m for _, m in unwrapped]
    # The units, and around them the modules whose own work falls between them (instrument/spans.py).
    blocks = TimerSet.of(units_of(block_units, modules), spans_of(block_units, modules), events, probe)
    layers = TimerSet.of(units_of(layer_units, modules), spans_of(layer_units, modules), events, probe)
    return Models(
        given=models, modules=modules, ddp=unwrapped[0][0], ddp_of={id(m): d for m, (d, _) in zip(models, unwrapped)},
        device=device, cuda=cuda, stamp=stamp, lane=lane, probe=probe, blocks=blocks, layers=layers,
        units_said=f"{describe_units([u.name for u in blocks.units])}; {len(layers.units)} layers",
        params=sum(p.numel() for m in modules for p in m.parameters()),
        name="+".join(model_name(m) for m in modules))
