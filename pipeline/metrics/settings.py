"""What a metrics computation is asked for: the bootstrap's settings and the population it counts.

Both are plain frozen values checked when they are made, so a wrong setting fails before any file is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.core.errors import PexecError

_UINT32 = 2**32


class MetricsError(PexecError, ValueError):
    """Metrics asked for with settings or cohort columns that do not fit (the message says which)."""


MAX_B = 10_000  # bootstrap replicates; measured on 200 rollouts: B = 10,000 peaks at 406 MB, 100,000 at 2.4 GB


@dataclass(frozen=True)
class BootstrapSettings:
    B: int = 1000  # at most MAX_B
    seed: int = 0
    method: Literal["multinomial", "poisson", "poisson-merged"] = "multinomial"
    level: float = 0.95

    def __post_init__(self) -> None:
        if not 1 <= self.B <= MAX_B:
            raise MetricsError(f"bootstrap B must be 1 to {MAX_B:,}, got {self.B}")
        if not 0 <= self.seed < _UINT32:
            raise MetricsError(f"bootstrap seed must be in [0, 2**32), got {self.seed}")
        if self.method not in ("multinomial", "poisson", "poisson-merged"):
            raise MetricsError(
                f"bootstrap method must be 'multinomial', 'poisson' or 'poisson-merged', got {self.method!r}"
            )
        if not 0 < self.level < 1:
            raise MetricsError(f"confidence level must be in (0, 1), got {self.level}")

    @property
    def quantiles(self) -> tuple[float, float]:
        alpha = (1 - self.level) / 2
        return alpha, 1 - alpha

    @property
    def sql_variables(self) -> dict[str, Any]:
        """The draws and percentiles as the .sql files read them (seed, B, q_lo, q_hi)."""
        q_lo, q_hi = self.quantiles
        return {"seed": self.seed, "B": self.B, "q_lo": q_lo, "q_hi": q_hi}


DEFAULT_BOOTSTRAP = BootstrapSettings()
HarnessErrors = Literal["exclude", "fail"]


@dataclass(frozen=True)
class Population:
    """Which rollouts every aggregate counts, and as what (sql/view_population.sql applies it).

    harness_errors: "exclude" leaves harness-error rollouts out of every metric; "fail" counts them as
    non-executable failures (executable and success false). Either way they are counted per cohort.
    pools: (pool name, its benchmarks): those benchmarks form one cohort under the pool's name; their tasks stay
    distinct per benchmark in the bootstrap.
    strict_replay: leave out the rollouts whose replay diverged from the log before their first error (their FED
    is not trustworthy); they are counted per cohort either way.
    """

    harness_errors: HarnessErrors = "exclude"
    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()
    strict_replay: bool = False

    def __post_init__(self) -> None:
        if self.harness_errors not in ("exclude", "fail"):
            raise MetricsError(f"harness errors are 'exclude' or 'fail', got {self.harness_errors!r}")
        seen: dict[str, str] = {}
        for name, benchmarks in self.pools:
            if not name or not benchmarks:
                raise MetricsError(f"a pool needs a name and its benchmarks, got {name!r}={','.join(benchmarks)!r}")
            for b in benchmarks:
                if b in seen:
                    raise MetricsError(f"benchmark {b!r} is in two pools: {seen[b]!r} and {name!r}")
                seen[b] = name

    @property
    def pooled(self) -> dict[str, str]:
        """benchmark -> the pool it is counted in."""
        return {b: name for name, benchmarks in self.pools for b in benchmarks}


DEFAULT_POPULATION = Population()


def harness_note(cohorts: Sequence[dict[str, Any]]) -> str:
    """How harness-error rollouts (the harness never really ran them) entered the cohorts' numbers."""
    n = sum(c["n_harness_error"] for c in cohorts)
    if cohorts and cohorts[0]["harness_errors"] == "fail":
        return f"Harness errors: {n}, counted in N as non-executable failures (executable and success false)."
    return f"Harness errors: {n}, left out of N and of every metric (--harness-errors fail counts them as failures)."


def replay_note(cohorts: Sequence[dict[str, Any]]) -> str:
    """How many rollouts' replay diverged from the log before their first error, and what was done with them."""
    diverged = sum(c["n_diverged_before_fed"] for c in cohorts)
    if cohorts and cohorts[0]["strict_replay"]:
        return (
            f"--strict-replay: {diverged} rollout(s) whose replay diverged from the log before their first error "
            "are left out of every number."
        )
    return (
        f"{diverged} rollout(s) diverged from the log before their first error (their FED is not trustworthy); "
        "they are counted (--strict-replay leaves them out)."
    )
