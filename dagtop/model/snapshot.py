"""Immutable results of the model: what the UI, the report and the tests read.

The collector thread builds these and hands them over whole; nothing here is ever mutated
after construction, so a snapshot can cross threads freely. Times are nanoseconds on the
common clock (each rank's monotonic clock shifted by its estimated offset), durations in ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from dagtop.model.change import Change
from dagtop.model.jobs import Losses, RunInfo
from dagtop.model.liveness_view import LivenessView
from dagtop.model.tasks import Tasks
from instrument.wire import Buckets, Telemetry, ThreadCpu
from instrument.wire_fields import Loader

WARM_UP = 1
"""Iterations ``0 .. WARM_UP - 1`` are warm-up, not the job's steady state: DDP rebuilds its buckets after
iteration 0, and the first iteration also pays for allocator warm-up and lazy initialisation. They are left out
of the steady verdict, the α-β fit of the collectives, ``report``'s default range and the history chart's scale."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One all-reduce across all ranks: it really starts when the last rank is ready."""

    name: str
    bytes: int
    ready_ns: Mapping[int, int]
    """Each rank's bucket-ready time."""
    start_ns: int
    """The latest ready time: the collective cannot start before every rank has issued it."""
    end_ns: int
    gating_rank: int
    """The rank whose readiness was latest: the one the others waited for."""

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class Segment(NamedTuple):
    """One stretch of the critical path (a tuple: a path through a per-layer backward has hundreds)."""

    rank: int | None
    """The rank the work ran on; None for a collective (all ranks at once)."""
    category: str
    phase: str
    name: str
    start_ns: int
    end_ns: int

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass(frozen=True, slots=True)
class Straggler:
    """The rank whose readiness gates the collectives, where it lost the time and how much."""

    rank: int
    category: str
    excess_ms: float
    """Its time in ``category`` before the gated bucket was ready, minus the other ranks' median: what the
    'straggler at median' what-if takes away."""
    busy_excess_ms: float = 0.0
    """Its busy time (io + pcie + compute) minus the other ranks' median: its ``RankRow.deviation_ms``, the one
    figure the screen shows for it."""


@dataclass(frozen=True, slots=True)
class Interference:
    """The fitted slow-down of one lane's compute under an in-flight collective (:mod:`dagtop.model.interference`)."""

    lane: str
    factor: float
    """k: a block fully overlapped by communication takes (1 + k) times as long as with none."""
    stderr: float
    """Standard error of ``factor``."""
    samples: int
    blocks: int

    @property
    def applied(self) -> float:
        """The factor used in the replay: the fit, never below 0 (a negative fit is noise, not a speed-up)."""
        return max(self.factor, 0.0)

    def describe(self) -> str:
        return (f"{self.lane}: compute ×{1 + self.factor:.3f} ± {self.stderr:.3f} under a collective "
                f"({self.samples} samples, {self.blocks} blocks)")


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    """Ring all-reduce cost t(P, M) = 2(P−1)α + 2(P−1)/P · M · β (seconds, bytes), fitted on the job's own
    collectives (:class:`dagtop.model.whatif.CommFit`), with the standard error of β."""

    alpha_s: float
    beta_s_per_byte: float
    beta_se: float = 0.0
    """Standard error of β (s/byte); 0 where the fit cannot say (fewer than three collectives)."""
    samples: int = 0
    sizes: int = 0
    """Distinct sizes among the transfers fitted (bytes of the collectives in flight together)."""
    alpha_known: bool = True
    """False where every transfer had the same bytes per collective: α cannot be told from β, and is taken as 0."""

    def seconds(self, workers: int, nbytes: float, beta: float | None = None) -> float:
        """t(P, M), with ``beta`` in place of the fitted β if given."""
        if workers <= 1:
            return 0.0
        b = self.beta_s_per_byte if beta is None else beta
        return 2 * (workers - 1) * self.alpha_s + 2 * (workers - 1) / workers * nbytes * b

    @property
    def bus_gbps(self) -> float:
        """1/β in GB/s: the bus bandwidth, as nccl-tests reports it (bytes × 2(P−1)/P per second)."""
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    @property
    def bus_gbps_range(self) -> tuple[float, float]:
        """The bus bandwidth with β one standard error up and down (the slower bound first)."""
        b, se = self.beta_s_per_byte, self.beta_se
        return (1e-9 / (b + se) if b + se > 0 else float("inf"), 1e-9 / (b - se) if b - se > 0 else float("inf"))

    def describe(self) -> str:
        lo, hi = self.bus_gbps_range
        spread = f" ({lo:.3g}–{hi:.3g} at ±1 s.e.)" if self.beta_se > 0 else ""
        latency = (f"latency α {self.alpha_s * 1e6:.0f} µs" if self.alpha_known else
                   "latency α unknown (taken as 0: with one transfer size it cannot be told from β)")
        return (f"bus bandwidth {self.bus_gbps:.3g} GB/s{spread}, {latency}; "
                f"fitted on {self.samples} collectives, {self.sizes} transfer size{'s' if self.sizes != 1 else ''}")


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The model's prediction for one change."""

    change: Change
    iteration_ms: float
    speedup: float
    """Iteration time now over iteration time with the change (above 1: faster iterations)."""
    bounds_ms: tuple[float, float] | None = None
    """The iteration time with the fitted β one standard error down and up, for the changes that rest on the α-β
    fit (``2N workers``, ``network bandwidth``): how far the prediction moves within the fit's uncertainty."""
    bandwidth_gbps: float | None = None
    """``network bandwidth``: the bus bandwidth it assumes, GB/s (``--bandwidth``; default twice the fitted)."""
    rank: int | None = None
    """``straggler at median``: the rank brought to the median (the steady verdict's straggler)."""
    unpredictable: str = ""
    """Why the model cannot predict this change on this job (then ``iteration_ms`` and ``speedup`` are NaN); empty
    when it can."""
    lower_bound: str = ""
    """Why the predicted gain is a lower bound on this job (the screen writes ``≥×1.35``); empty when it is not."""

    @property
    def predictable(self) -> bool:
        return not self.unpredictable

    @property
    def label(self) -> str:
        """The change as the screen names it: ``network 4.8 GB/s`` for a bandwidth, else the change."""
        if self.bandwidth_gbps is not None:
            return f"network {self.bandwidth_gbps:.3g} GB/s"
        return str(self.change)

    @property
    def throughput(self) -> float:
        """Samples per second with the change over samples per second now: the speedup times the worker count,
        since every rank keeps its batch (``2N workers`` at 350 ms against 270 ms now: ×1.54)."""
        return self.speedup * self.change.workers

    @property
    def efficiency(self) -> float:
        """Throughput gained per worker added: the throughput over the worker count (1 for a perfect scale-out)."""
        return self.throughput / self.change.workers


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank's line in the per-rank table."""

    rank: int
    iteration_ms: float
    """From the iteration's start (the latest previous-iteration end across ranks) to this rank's last task end:
    never more than the iteration's measured time."""
    io_ms: float
    pcie_ms: float
    compute_ms: float
    allreduce_ms: float
    """Wall time with at least one of the rank's buckets in flight (ready to done, waiting included)."""
    other_ms: float
    deviation_ms: float
    """Busy time (io + pcie + compute) minus the median of the other ranks'. In synchronous SGD every rank's
    iteration takes the same wall time, the early ones waiting in a collective: the difference shows in the work
    done. Against the others (not all ranks, itself included) so that with two ranks the straggler's figure is
    the whole difference, as in its verdict, not half of it."""
    straggler: bool


@dataclass(frozen=True, slots=True)
class SteadyStraggler:
    """A rank named the straggler over the steady verdict's window, on evidence (:mod:`dagtop.model.straggler`)."""

    rank: int
    category: str
    """The work category (io, pcie, compute) in which it was named: where it loses the time."""
    above: int
    """Iterations of the window in which its time in ``category`` was above the other ranks' median."""
    excess_ms: float
    """Median over every iteration of the window of its time in ``category`` minus the other ranks' median: the
    headline's figure, and what 'straggler at median' takes away."""
    excess_range_ms: tuple[float, float] = (0.0, 0.0)
    """The 95 % confidence interval of that median (order statistics of the binomial)."""
    busy_excess_ms: float = 0.0
    """Median over the window of its busy time (io + pcie + compute) minus the other ranks' median (Δ busy)."""
    iterations: int = 0
    """Iterations of the window in which it was above or below the others in ``category`` (ties left out)."""
    p_value: float = 0.0
    """The sign test's one-sided p-value, corrected for the number of tests (ranks × categories)."""

    def describe(self) -> str:
        """``compute +35 ms [28, 41]``: the category and the excess with its interval."""
        lo, hi = self.excess_range_ms
        return f"{self.category} {self.excess_ms:+.0f} ms [{lo:.0f}, {hi:.0f}]"


GATHER: Final = 10
"""Counted iterations (complete, past warm-up, not stalled) the steady verdict needs before it says anything."""


@dataclass(frozen=True, slots=True)
class SteadyVerdict:
    """What held the job back over the last ``iterations`` counted iterations (see :mod:`dagtop.model.verdict`).

    Until :data:`GATHER` iterations are counted it is only gathering (:attr:`gathering`): no bottleneck, no
    straggler. Where the top two categories' shares are within the window's own spread it is a tie
    (:attr:`tied_with`), said as such rather than picking one.
    """

    iterations: int
    bottleneck: str
    """The category holding the most of the window's critical-path time ("" while gathering)."""
    share: float
    """The bottleneck's fraction of the window's critical-path time."""
    straggler: SteadyStraggler | None
    tied_with: str | None = None
    """The runner-up category, when its share cannot be told from the bottleneck's over the window."""
    tied_share: float = 0.0
    """The runner-up's fraction of the window's critical-path time (0 when not tied)."""

    @property
    def gathering(self) -> bool:
        """Fewer than :data:`GATHER` iterations counted: no verdict yet."""
        return self.iterations < GATHER


@dataclass(frozen=True, slots=True)
class IterationAnalysis:
    """Everything the model knows about one iteration across all ranks."""

    iteration: int
    complete: bool
    """False when a rank's events never came; the rest of the fields then cover the ranks that did."""
    ranks: tuple[int, ...]
    origin_ns: int
    """Start of the iteration on the common clock: timelines are drawn relative to it."""
    measured_ms: float
    predicted_ms: float
    """The identity replay of the DAG: the paper's model of this iteration."""
    tasks: Tasks
    """Every task of the ranks that reported the iteration (empty once the pipeline's task budget took them);
    any sequence of :class:`Task` given here is grouped into :class:`Tasks`."""
    collectives: tuple[Collective, ...]
    critical_path: tuple[Segment, ...]
    shares: Mapping[str, float]
    """Category → fraction of the critical path; sums to 1."""
    bottleneck: str
    straggler: Straggler | None
    exposed_comm_ms: float
    """Communication not hidden under compute: how much shorter the replayed iteration is with free collectives."""
    overlap_ratio: float
    """Fraction of all-reduce time hidden under computation (1 = fully overlapped)."""
    per_rank: tuple[RankRow, ...]
    what_if: tuple[WhatIf, ...]
    steady: SteadyVerdict | None = None
    """The steady verdict as of this iteration: set by the pipeline, which sees the iterations before it."""
    stalled: bool = False
    """The job stalled in this iteration (:mod:`dagtop.model.liveness`): it is reported as a stall and kept out of
    the steady verdict, the report's shares and its what-if medians."""
    interference: tuple[Interference, ...] = ()
    """The compute slow-down under collectives fitted up to this iteration, per lane, that its what-ifs used."""
    network: AlphaBeta | None = None
    """The α-β fit the scaling what-ifs used (None with one rank, or before any collective was timed)."""
    warm_up: bool | None = None
    """Whether it is one of its run's first :data:`WARM_UP` iterations (a restarted job warms up again); None: by
    its number alone (hand-built analyses)."""

    @property
    def in_warm_up(self) -> bool:
        """One of the first :data:`WARM_UP` iterations of its run: not the job's steady state."""
        return self.iteration < WARM_UP if self.warm_up is None else self.warm_up

    def __post_init__(self) -> None:
        if not isinstance(self.tasks, Tasks):  # hand-built (tests): group them here, once
            object.__setattr__(self, "tasks", Tasks(self.tasks))


@dataclass(frozen=True, slots=True)
class RankInfo:
    """A rank as the monitor knows it from its hello and its frames."""

    rank: int
    host: str
    pid: int
    device: str
    model: str
    params: int
    last_iteration: int | None
    last_seen_ns: int
    """Monitor clock of the last frame from this rank."""
    clock_offset_ns: int
    """Estimated offset added to this rank's clock to put it on the common clock (0 on one host)."""
    connected: bool
    loader: Loader | None = None
    """The settings of the DataLoader the rank times (its hello's), None where it times none."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole state the screen draws, at one instant."""

    iterations: tuple[IterationAnalysis, ...]
    """Rolling window of analysed iterations, oldest first."""
    ranks: tuple[RankInfo, ...]
    ranks_expected: int
    iterations_per_s: float
    dropped: int
    """Frames lost after the monitor first heard their rank, at the rank or on the way (:attr:`losses`)."""
    rejected: int
    """Frames the monitor refused (malformed, wrong wire version, unknown rank)."""
    last_rejection: str | None
    incomplete: int
    """Iterations given up on because a rank's events never came."""
    received_ns: int
    """Monitor clock when the newest frame folded in arrived (0 before any)."""
    finished: bool = False
    """The source will send nothing more (a recording read to its end)."""
    notes: tuple[str, ...] = field(default=())
    """Plain-language remarks for the user (e.g. the clock-offset estimate across hosts)."""
    telemetry: tuple[Telemetry, ...] = field(default=())
    """Each rank's latest host and GPU telemetry as of the newest frame folded in, by host then rank (empty
    when the ranks send none: a shim older than the telemetry frame)."""
    liveness: LivenessView = field(default=LivenessView())
    """Silent, gone and restarted ranks, and where the others wait while an iteration is stalled."""
    losses: Losses = field(default=Losses())
    """What never arrived, by reason."""
    runs: tuple[RunInfo, ...] = field(default=())
    """The followed job's runs (a restart begins a new one), oldest first."""
    job_line: str = ""
    """What the screen says of the job itself for a while: a restart just now, a second job publishing here."""
    buckets: Buckets | None = None
    """DDP's bucket map as the lowest rank that sent one has it (the same on every rank): which parameters, of how
    many bytes, each bucket holds. None before DDP rebuilt its buckets, or without DDP."""
    thread_cpu: Mapping[int, Mapping[int, ThreadCpu]] = field(default_factory=dict)
    """Iteration → rank → the training thread's CPU times in it, for the latest iterations of CPU ranks (empty for
    GPU ranks and older shims)."""

    @property
    def latest(self) -> IterationAnalysis | None:
        return self.iterations[-1] if self.iterations else None

    @property
    def running(self) -> bool:
        """Whether a job is running, as far as the monitor can tell: a rank is connected (said hello and not bye,
        its process not gone) and the source has not ended. False before any rank said hello."""
        return not self.finished and any(r.connected for r in self.ranks)

    @property
    def iterations_per_s_now(self) -> float:
        """Iterations per second now: the recent rate while the job runs, 0 once it ended or while an iteration
        is stalled (the rate of the last iterations would say it still runs)."""
        return self.iterations_per_s if self.running and not self.liveness.stalled_s else 0.0


EMPTY_SNAPSHOT = Snapshot(
    iterations=(),
    ranks=(),
    ranks_expected=0,
    iterations_per_s=0.0,
    dropped=0,
    rejected=0,
    last_rejection=None,
    incomplete=0,
    received_ns=0,
)
