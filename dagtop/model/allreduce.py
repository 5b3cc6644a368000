"""A bucket all-reduce's cost as the bucket advice needs it: latency, per-byte time, and how much slower it runs
while the backward still computes, fitted on the job's own buckets.

Compute and communication share the machine: on CPU ranks the cores (gloo reduces and copies on them), on GPUs the
SMs and memory bandwidth (Echo models it; FIELD_NOTES). A bucket all-reduced under the backward runs ``1 + κ``
times slower than one after it. Without that term a fit on DDP's default buckets (a small first bucket under the
backward, a large one after it) reads the small one's slowness as latency: measured on a 2-rank CPU job, α 8.4 ms
fitted where an all-reduce alone costs 0.4 ms; with κ fitted too, α 0.4 ms.

The fit, where the all-reduces that ran wholly after the backward have three sizes or more: α and β are the
least-squares line through those alone (nothing of the job ran beside them); the stretch is then the one whose
schedule of the buckets ends where the observed all-reduces ended (:func:`dagtop.model.buckets.tail_stretch`).
Fitting all three on every all-reduce at once proved ill-conditioned on a loaded 2-core machine (κ at the grid's
top and α 0 on three CPU jobs, 2026-11-27: a larger stretch and a smaller latency explain the few small buckets
beside the backward equally well, and their durations there are more scheduling than work), so that joint fit is
the fallback where fewer sizes ran after the backward: for each κ of a grid, each observed all-reduce's duration
less what the stretch added to it (``d − o·κ/(1+κ)``, ``o`` its time under the backward) is the time it would
have taken alone; α and β are the least-squares line through those (α ≥ 0), and the κ whose line fits best is
kept.

    >>> c = AllReduce(a_ns=1e6, b_ns_per_byte=1.0, kappa=1.0, workers=2)
    >>> c.finish(start=0, work=4e6, backward_end=2e6)  # 2 ms at half speed does 1 ms of work; 3 ms left after
    5000000.0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KAPPAS = tuple(k / 20 for k in range(121))
"""The stretches tried: 0 to 6 in steps of 0.05."""


@dataclass(frozen=True, slots=True)
class AllReduce:
    """t(M) = a + b·M ns for M bytes with nothing else running, ``1 + kappa`` times longer under the backward, on
    ``workers`` ranks (ring: ``a = 2(P−1)α``, ``b = 2(P−1)/P·β``)."""

    a_ns: float
    b_ns_per_byte: float
    kappa: float
    workers: int
    b_se: float = 0.0
    """Standard error of ``b``."""
    samples: int = 0
    sizes: int = 0
    """Distinct bucket sizes fitted on."""
    smallest: int = 0
    """The smallest bucket fitted on, bytes: below it the latency is extrapolated."""
    after: int = 0
    """All-reduces fitted on that ran wholly after the backward: α and β come from them alone when non-zero (and
    κ, 0 here, from the buckets' schedule)."""
    largest: int = 0
    """The largest bucket all-reduced, bytes, fitted on or not (those beside the backward set κ): above it the
    per-byte time is extrapolated (0: unknown)."""

    def work(self, nbytes: float, b: float | None = None) -> float:
        """ns for ``nbytes`` with nothing else running (``b`` in place of the fitted per-byte time)."""
        return self.a_ns + (self.b_ns_per_byte if b is None else b) * nbytes

    def done_beside(self, nbytes: float, start: float, end: float, backward_end: float) -> float:
        """ns of work an all-reduce observed from ``start`` to ``end`` did before ``backward_end``: its work alone
        less what it did after the backward (at full speed), within its time beside the backward."""
        beside = max(min(end, backward_end) - start, 0.0)
        return min(max(self.work(nbytes) - (end - start - beside), 0.0), beside)

    def finish(self, start: float, work: float, backward_end: float) -> float:
        """When an all-reduce of ``work`` ns begun at ``start`` ends: stretched until ``backward_end``."""
        if start >= backward_end:
            return start + work
        capacity = (backward_end - start) / (1 + self.kappa)
        if work <= capacity:
            return start + work * (1 + self.kappa)
        return backward_end + work - capacity

    def at(self, workers: int) -> AllReduce:
        """The same α, β and κ on ``workers`` ranks (the ring formula)."""
        if workers == self.workers or self.workers <= 1:
            return self
        p, q = self.workers, workers
        per = (2 * (q - 1) / q) / (2 * (p - 1) / p)
        return AllReduce(self.a_ns * (q - 1) / (p - 1), self.b_ns_per_byte * per, self.kappa, workers,
                         self.b_se * per, self.samples, self.sizes, self.smallest, self.after, self.largest)

    def describe(self) -> str:
        on = (f"α-β fit on the {self.after} bucket all-reduces after the backward ({self.sizes} sizes), κ from the "
              f"buckets' tail" if self.after else
              f"α-β-κ fit on {self.samples} bucket all-reduces of {self.sizes} sizes")
        return (f"{on}: latency "
                f"{self.a_ns / 2 / max(self.workers - 1, 1) / 1e3:.0f} µs, bus bandwidth "
                f"{1 / (self.b_ns_per_byte * self.workers / (2 * (self.workers - 1))) if self.b_ns_per_byte else 0:.3g} "
                f"GB/s, ×{1 + self.kappa:.2f} under the backward")


Observed = tuple[int, float, float, float]
"""One bucket all-reduce: (bytes, start ns, end ns, end of the backward it ran beside, ns)."""


def fit(observed: Sequence[Observed], workers: int) -> AllReduce | None:
    """The fit over the bucket all-reduces given (in time order within each iteration); None without two."""
    if len(observed) < 2 or workers <= 1:
        return None
    m = np.array([o[0] for o in observed], dtype=np.float64)
    start = np.array([o[1] for o in observed], dtype=np.float64)
    end = np.array([o[2] for o in observed], dtype=np.float64)
    bend = np.array([o[3] for o in observed], dtype=np.float64)
    d = np.maximum(end - start, 0.0)
    under = np.clip(np.minimum(end, bend) - start, 0.0, None)
    after = under <= 0
    if _sizes(m[after]) >= MIN_SIZES_AFTER:
        a, b, var = _line(m[after], d[after])
        sse = float(((d[after] - a - b * m[after]) ** 2).sum())
        n, free = int(after.sum()), 2 if a > 0 else 1
        se = (sse / (n - free) * var) ** 0.5 if n > free else 0.0
        return AllReduce(a, b, 0.0, workers, se, len(m), _sizes(m[after]), int(m[after].min()), n, int(m.max()))
    best: tuple[float, float, float, float, float] | None = None  # sse, a, b, kappa, var(b) per unit
    for k in KAPPAS:
        w = d - under * k / (1 + k)
        a, b, var = _line(m, w)
        sse = float(((w - a - b * m) ** 2).sum())
        if best is None or sse < best[0] - 1e-9 * max(best[0], 1.0):
            best = (sse, a, b, k, var)
    assert best is not None
    sse, a, b, k, var = best
    free = 2 if a > 0 else 1
    se = (sse / (len(m) - free) * var) ** 0.5 if len(m) > free else 0.0
    return AllReduce(a, b, k, workers, se, len(m), _sizes(m), int(m.min()), largest=int(m.max()))


MIN_SIZES_AFTER = 3
"""Distinct sizes among the all-reduces after the backward that α and β are fitted on alone."""


def _sizes(m: np.ndarray) -> int:
    return len({round(x, -3) for x in m.tolist()})


def _line(m: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Least-squares w = a + b·m with a ≥ 0 and b ≥ 0: (a, b, var(b) per unit of residual variance)."""
    n, sm, smm, sw, smw = len(m), m.sum(), (m * m).sum(), w.sum(), (m * w).sum()
    det = n * smm - sm * sm
    if det > 1e-9 * n * smm:
        a = (smm * sw - sm * smw) / det
        b = (n * smw - sm * sw) / det
        if a >= 0 and b >= 0:
            return float(a), float(b), float(n / det)
    if smm > 0:  # through the origin
        b = smw / smm
        if b >= 0:
            return 0.0, float(b), float(1 / smm)
    return float(max(w.mean(), 0.0)), 0.0, 0.0
