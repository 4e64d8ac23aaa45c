"""Which interval a metric gets, and the small-sample one (docs/explanation/intervals.md, "Small samples").

The task bootstrap (metrics/sql/metrics_intervals.sql) is reported where it is informative. Where it degenerates --
the estimate is 0 or 1 (every replicate equals it), the replicates do not spread, or the denominator has
fewer than MIN_TASKS tasks or MIN_DENOMINATOR units -- the interval is a Wilson score interval on the
effective sample size n_eff = n / design effect, the design effect estimated from the task clustering
(at least 1). Wilson is closed form and never has zero width for n_eff > 0.

Every ratio metric is sum(y_i) / sum(x_i) over tasks i. Its cluster-robust variance is
m / (m - 1) * sum_i (y_i - r x_i)^2 / X^2 (m tasks with x_i > 0, X = sum x_i); a sample of X independent
units would give r (1 - r) / X; the design effect is their ratio. For a mean of a quantity in [0, 1] that is
not a count (AUC-PEC), r (1 - r) bounds the variance of any [0, 1] variable with mean r, so the same interval
is conservative. At r = 0 or 1 there is no variation to estimate the design effect from; each task then
counts as one unit (n_eff = m: rollouts of a task are taken as fully correlated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final, Literal

# Below either threshold the task bootstrap is not trusted (defined here only; docs/explanation/intervals.md, "Small
# samples").
MIN_TASKS = 30  # tasks with a nonzero denominator
MIN_DENOMINATOR = 30  # the denominator's total: rollouts (calls for the output-match rate)

Method = Literal["bootstrap", "wilson-clustered"]
BOOTSTRAP: Final = "bootstrap"
WILSON: Final = "wilson-clustered"
MARK = "†"  # what the tables put beside a Wilson interval, with NOTE below them
NOTE = (
    f"{MARK} Wilson score interval on the effective sample size (n / design effect from the task clustering): "
    f"fewer than {MIN_TASKS} tasks or {MIN_DENOMINATOR} units in the denominator, or an estimate at 0 or 1, "
    "where the task bootstrap degenerates."
)


@dataclass(frozen=True)
class Cluster:
    """What the small-sample interval needs of one (cohort, metric), from pipeline.metrics.bootstrap.moments: per task i
    the numerator part's sum y_i and the denominator part's x_i (value = sum y / sum x / scale)."""

    value: float  # the point estimate r
    den_total: int  # X (for AUC-PEC: rollouts; for the output-match rate: calls)
    den_tasks: int  # m: tasks with x_i > 0
    num_total: int  # Y
    yy: int  # sum y_i^2
    xy: int  # sum x_i y_i
    xx: int  # sum x_i^2
    scale: float = 1.0

    @property
    def resid_ss(self) -> float:
        """sum over tasks of (y_i / scale - r x_i)^2, from the integer moments (exact up to the last division)."""
        X, Y = self.den_total, self.num_total
        return (self.yy * X * X - 2 * Y * X * self.xy + Y * Y * self.xx) / (X * X * self.scale * self.scale)


def small_sample(c: Cluster) -> bool:
    """The denominator is below a threshold (the tables mark such cells)."""
    return c.den_tasks < MIN_TASKS or c.den_total < MIN_DENOMINATOR


def choose(c: Cluster, lo: float | None, hi: float | None) -> Method:
    """The bootstrap unless it degenerates (docstring of this module)."""
    at_bound = c.value <= 0 or c.value >= 1
    flat = lo is None or hi is None or lo >= hi
    return WILSON if at_bound or flat or small_sample(c) else BOOTSTRAP


def effective_n(c: Cluster) -> float:
    """n / design effect (design effect >= 1); the number of tasks when it cannot be estimated."""
    r, X, m = c.value, c.den_total, c.den_tasks
    if m < 2 or r <= 0 or r >= 1:
        return float(m)
    cluster_var = m / (m - 1) * c.resid_ss / X**2
    deff = max(1.0, cluster_var / (r * (1 - r) / X))
    return X / deff


def wilson(p: float, n: float, level: float) -> tuple[float, float]:
    """Wilson score interval for a proportion p observed on n (possibly fractional) independent units."""
    if n <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    z2 = z * z
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    # The score interval contains p; clamping only removes rounding at the ends.
    return max(0.0, min(center - half, p)), min(1.0, max(center + half, p))


def interval(c: Cluster, lo: float | None, hi: float | None, level: float) -> tuple[float | None, float | None, Method]:
    """(lo, hi, method) to report: the bootstrap's bounds, or Wilson on the effective sample size."""
    method = choose(c, lo, hi)
    if method == BOOTSTRAP:
        return lo, hi, method
    w_lo, w_hi = wilson(c.value, effective_n(c), level)
    return w_lo, w_hi, method
