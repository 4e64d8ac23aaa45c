"""Ranking divergence: do success and the executability metrics order the conditions the same way?

Per benchmark (or per benchmark and value of `report --within COL`), conditions are ranked by success and by
every metric the catalogue marks `ranked` (TER, AUC-PEC; rank 1 = highest; ties share the mean of their ranks),
compared by Kendall's τ-b (which accounts for ties), and every pair whose order under success is the opposite
of its order under a ranked metric is listed as a flip, with the share of the bootstrap replicates (the draws
of the intervals) in which that flip holds too: near 1 a real reversal, near or below 0.5 noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class Flip:
    metric: str  # the executability metric that disagrees with success
    higher_success: str
    higher_metric: str
    # Share of the replicates (with all four values defined) in which higher_success is above under success and
    # higher_metric above under the metric; None without replicates.
    share: float | None = None


@dataclass(frozen=True)
class Ranking:
    group: dict[str, str | None]  # benchmark (and the --within column) -> value
    conditions: list[str]
    values: dict[str, list[float | None]]  # metric -> value per condition
    ranks: dict[str, list[float]]  # metric -> rank per condition
    tau: dict[str, float | None]  # metric -> τ-b against success; None when undefined
    flips: list[Flip]


def ranks(values: Sequence[float | None]) -> list[float]:
    """Rank 1 = largest; tied values share the mean of their ranks; a missing value ranks last."""
    keyed = [-math.inf if v is None else v for v in values]
    order = sorted(range(len(keyed)), key=lambda i: -keyed[i])
    out = [0.0] * len(keyed)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and keyed[order[j + 1]] == keyed[order[i]]:
            j += 1
        for p in range(i, j + 1):
            out[order[p]] = (i + j) / 2 + 1
        i = j + 1
    return out


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's τ-b; None when either ordering is all ties (the statistic is undefined)."""
    concordant = discordant = ties_x = ties_y = 0
    for i, j in combinations(range(len(x)), 2):
        dx, dy = _sign(x[i] - x[j]), _sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif dx == dy:
            concordant += 1
        else:
            discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def rank_conditions(
    group: dict[str, str | None],
    conditions: list[str],
    values: dict[str, list[float | None]],
    replicates: dict[str, list[np.ndarray]] | None = None,
) -> Ranking:
    """`values` has "success" first, then every metric to rank against it; one value per condition.
    `replicates[metric][condition]` are the bootstrap replicates' values, b = 0..B-1 (NaN: undefined)."""
    ranked_by = [m for m in values if m != "success"]
    all_ranks = {m: ranks(values[m]) for m in values}
    # τ on ranks (negated: rank 1 is best) equals τ on the values, with missing values ranked last.
    tau = {m: kendall_tau_b(all_ranks["success"], all_ranks[m]) for m in ranked_by}
    flips = []
    for m in ranked_by:
        r_s, r_m = all_ranks["success"], all_ranks[m]
        for i, j in combinations(range(len(conditions)), 2):
            if _sign(r_s[i] - r_s[j]) * _sign(r_m[i] - r_m[j]) < 0:
                hi_s, hi_m = (i, j) if r_s[i] < r_s[j] else (j, i)
                share = None if replicates is None else flip_share(replicates, m, hi_s, hi_m)
                flips.append(Flip(m, conditions[hi_s], conditions[hi_m], share))
    return Ranking(group, conditions, values, all_ranks, tau, flips)


def flip_share(replicates: dict[str, list[np.ndarray]], metric: str, hi_s: int, hi_m: int) -> float | None:
    """Share of the replicates in which condition hi_s is above hi_m under success and below it under `metric`
    (strictly); replicates where any of the four values is undefined (NaN) are left out. None when none is left."""
    s_hi, s_lo = replicates["success"][hi_s], replicates["success"][hi_m]
    m_lo, m_hi = replicates[metric][hi_s], replicates[metric][hi_m]
    used = ~(np.isnan(s_hi) | np.isnan(s_lo) | np.isnan(m_lo) | np.isnan(m_hi))
    n = int(used.sum())
    holds = int(((s_hi > s_lo) & (m_hi > m_lo) & used).sum())
    return holds / n if n else None


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)
