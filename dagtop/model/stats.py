"""Distribution-free statistics the verdicts rest on: the sign test and the median's confidence interval.

Both use only the binomial distribution with p = 1/2, so they hold whatever the shape of the per-iteration figures
(skewed, heavy-tailed, one slow outlier): they count which side of zero each value falls, or where it ranks.

>>> sign_test(20, 18)  # 18 of 20 iterations above the others: P(≥ 18 of 20 by chance) = 211 / 2^20
0.00020122528076171875
>>> median_interval([float(x) for x in range(1, 21)])  # the 6th and 15th of 20 cover the median with ≥ 95 %
(6.0, 15.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from statistics import NormalDist

EXACT_UP_TO = 400
"""Values up to which the median's interval takes the binomial's exact order statistics (past it, its normal
approximation: a report over a long recording has thousands)."""


@cache
def _tail(n: int, k: int) -> float:
    """P(B ≥ k) for B ~ Binomial(n, 1/2)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, j) for j in range(k, n + 1)) / (1 << n)  # ints: 2.0**n overflows from n = 1024


def sign_test(n: float, k: float) -> float:
    """One-sided p-value of the sign test: the chance of ``k`` or more of ``n`` non-zero values above zero when each
    is as likely above as below (1.0 for n = 0).

    ``n`` and ``k`` may be fractional, as an effective sample size makes them (:func:`dagtop.model.straggler.evidence`): the tail is
    then the regularized incomplete beta function I½(k, n − k + 1), which is the binomial tail at whole numbers.
    """
    if n <= 0 or k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if float(n).is_integer() and float(k).is_integer():
        return _tail(int(n), int(k))
    return _incomplete_beta(k, n - k + 1.0, 0.5)


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return front * f


@cache
def _rank(n: int, confidence: float) -> int:
    """The order statistic (1-based) of the interval's lower end: the largest l with P(B < l) ≤ (1 − c) / 2."""
    alpha = (1.0 - confidence) / 2.0
    if n > EXACT_UP_TO:  # the normal approximation, exact enough here; the exact walk is O(n²) in big integers
        return max(1, math.floor((n - NormalDist().inv_cdf(1.0 - alpha) * math.sqrt(n)) / 2.0))
    lo = 1
    while lo < n and 1.0 - _tail(n, lo + 1) <= alpha:  # P(B ≤ lo) = P(B < lo + 1)
        lo += 1
    return lo


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A confidence interval for the median of the population ``values`` are drawn from: the order statistics
    x(l) and x(n + 1 − l), with l the largest rank whose binomial tail leaves at least ``confidence`` covered.

    With too few values for that confidence (fewer than 6 at 95 %) the interval is the whole range: its coverage,
    1 − 2 / 2^n, is then the most the values allow.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    lo = _rank(n, confidence)
    return xs[lo - 1], xs[n - lo]
