"""Fix against buy: what an epoch costs now, with each candidate change, and with more workers; and the GPU-hours
lost so far to exposed communication, data loading and the straggler.

A rank is one GPU (a CPU job's ranks count the same way: device-hours). With ``P`` ranks stepping every ``t``
seconds, an epoch of ``S`` steps takes ``S·t`` hours' worth of wall time and ``P·S·t`` GPU-hours. A change that
gives ``x`` times the samples per second on ``k`` times the workers takes ``1/x`` the wall time and ``k/x`` the
GPU-hours: scaling out at efficiency ``E = x/k`` pays a ``1/E`` premium per sample.

    >>> now = epoch_cost(step_ms=500.0, steps=7200, ranks=8, price=2.0)  # 1 h on 8 GPUs at $2/GPU-hour
    >>> round(now.hours, 3), round(now.gpu_hours, 3), now.dollars
    (1.0, 8.0, 16.0)
    >>> twice = scaled(now, throughput=1.6, workers=2, price=2.0)  # 2N workers at 80 % efficiency
    >>> round(twice.hours, 3), round(twice.gpu_hours, 3), twice.dollars  # faster, and 1/0.8 = 1.25× the cost
    (0.625, 10.0, 20.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dagtop.model.advice import Advice, Candidate
from dagtop.model.analysis import segments_ms
from dagtop.model.change import Change
from dagtop.model.snapshot import IterationAnalysis, RankInfo
from dagtop.model.verdict import counts
from instrument.wire_fields import Loader


@dataclass(frozen=True, slots=True)
class CostTerms:
    """What the user tells about money and epochs (``--gpu-hour-price``, ``--epoch-samples``, ``--batch-size``)."""

    gpu_hour_price: float | None = None
    """US dollars per GPU-hour; None: GPU-hours only."""
    epoch_samples: int | None = None
    """Samples in an epoch; None: the DataLoader's length (batches per epoch per rank), where the shim knows it."""
    batch_size: int | None = None
    """Samples per rank per step, where the DataLoader does not say."""


NO_TERMS = CostTerms()
"""No price, no epoch length given: GPU-hours from the DataLoader's length only."""


@dataclass(frozen=True, slots=True)
class Epoch:
    """How long an epoch is, and where that came from."""

    steps: int
    source: str
    """``--epoch-samples 1200000 at 32 per rank`` or ``the DataLoader's length``."""


def epoch_of(terms: CostTerms, loader: Loader | None, ranks: int) -> Epoch | str:
    """Steps per epoch, or why they are not known."""
    if terms.epoch_samples is not None:
        batch = terms.batch_size or (loader.batch_size if loader is not None else None)
        if not batch:
            return ("--epoch-samples needs the batch per rank: give --batch-size, or time the DataLoader "
                    "(tracer.loader)")
        return Epoch(max(1, math.ceil(terms.epoch_samples / (batch * max(ranks, 1)))),
                     f"--epoch-samples {terms.epoch_samples} at {batch} per rank × {ranks} ranks")
    if loader is not None and loader.batches:
        return Epoch(loader.batches, f"the DataLoader's length ({loader.batches} batches per rank)")
    return "epoch length unknown: give --epoch-samples N (or time a DataLoader with a length through tracer.loader)"


@dataclass(frozen=True, slots=True)
class EpochCost:
    """One epoch's wall time, GPU-hours and dollars (None without a price)."""

    hours: float
    gpu_hours: float
    dollars: float | None
    at_most: bool = False
    """The figures are upper bounds: the change's gain is a lower bound (:attr:`Candidate.lower_bound`)."""


def epoch_cost(step_ms: float, steps: int, ranks: int, price: float | None) -> EpochCost:
    """An epoch of ``steps`` steps of ``step_ms`` on ``ranks`` GPUs."""
    hours = steps * step_ms / 3.6e6
    return EpochCost(hours, hours * ranks, hours * ranks * price if price is not None else None)


def scaled(now: EpochCost, throughput: float, workers: int, price: float | None, at_most: bool = False) -> EpochCost:
    """The epoch with ``throughput`` times the samples per second on ``workers`` times the GPUs; ``at_most``: the
    throughput is a lower bound, so the epoch's figures are upper ones."""
    hours = now.hours / throughput
    gpu_hours = now.gpu_hours * workers / throughput
    return EpochCost(hours, gpu_hours, gpu_hours * price if price is not None else None, at_most)


@dataclass(frozen=True, slots=True)
class Waste:
    """GPU-hours lost over the iterations seen, by cause: each the time the iterations would have been shorter
    without it alone (they overlap, so they do not add up), times the ranks that waited."""

    iterations: int
    gpu_hours: float
    """All the GPU-hours of those iterations."""
    communication: float
    """Exposed communication: what free collectives would have saved (the 'perfect overlap' replay)."""
    loading: float
    """Data loading on the critical path."""
    straggler: float
    """What bringing the named straggler to the median would have saved (the verdict's 'straggler at median'
    replays of its rank)."""
    straggler_lower_bound: str = ""
    """Why :attr:`straggler` is only a lower bound (those replays are: :attr:`Candidate.lower_bound`); empty when it
    is a point."""

    @property
    def seconds(self) -> float:
        return 0.0 if not self.iterations else self.gpu_hours * 3600


def waste(analyses: Sequence[IterationAnalysis], straggler_rank: int | None) -> Waste:
    """The waste over ``analyses`` (complete, steady iterations)."""
    total = comm = io = late = 0.0
    lower = ""
    for a in analyses:
        ranks = len(a.ranks)
        total += a.measured_ms * ranks
        comm += a.exposed_comm_ms * ranks
        io += segments_ms(a.critical_path).get("io", 0.0) * ranks
        w = next((w for w in a.what_if if w.change is Change.STRAGGLER_AT_MEDIAN and w.rank == straggler_rank),
                 None) if straggler_rank is not None else None
        if w is not None and w.predictable:
            late += max(a.predicted_ms - w.iteration_ms, 0.0) * ranks
            lower = w.lower_bound or lower
    return Waste(len(analyses), total / 3.6e6, comm / 3.6e6, io / 3.6e6, late / 3.6e6, lower)


@dataclass(frozen=True, slots=True)
class FixOrBuy:
    """An epoch now, with each predicted candidate, and the waste so far: the advice priced."""

    terms: CostTerms
    epoch: Epoch | None
    unknown: str
    """Why the epoch's length is not known ("" when it is)."""
    now: EpochCost | None
    rows: tuple[tuple[Candidate, EpochCost], ...]
    """Each predicted fix then buy, with its epoch."""
    waste: Waste


def fix_or_buy(advice: Advice, analyses: Sequence[IterationAnalysis], ranks: Sequence[RankInfo],
               terms: CostTerms) -> FixOrBuy:
    """``advice`` priced per epoch (where its length is known), and the waste over ``analyses``."""
    loader = next((r.loader for r in sorted(ranks, key=lambda r: r.rank) if r.loader is not None), None)
    count = max((len(a.ranks) for a in analyses), default=len(ranks)) or len(ranks)
    epoch = epoch_of(terms, loader, count)
    steady = [a for a in analyses if counts(a)]
    last = next((a.steady for a in reversed(steady) if a.steady is not None), None)
    lost = waste(steady, last.straggler.rank if last is not None and last.straggler is not None else None)
    if isinstance(epoch, str) or advice.held:
        return FixOrBuy(terms, None if isinstance(epoch, str) else epoch, epoch if isinstance(epoch, str) else "",
                        None, (), lost)
    now = epoch_cost(advice.step_ms, epoch.steps, count, terms.gpu_hour_price)
    rows = tuple((c, scaled(now, c.throughput, c.workers, terms.gpu_hour_price, at_most=bool(c.lower_bound)))
                 for c in (*advice.fixes, *advice.buys) if c.throughput)
    return FixOrBuy(terms, epoch, "", now, rows, lost)
