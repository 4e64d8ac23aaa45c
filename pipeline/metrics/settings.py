"""What a metrics computation is asked for: the bootstrap's settings, the population it counts, and the two
together with the cohort columns and PEC depth (`MetricsSettings`, what `pexec metrics` options and a job's
[metrics] table say).

Each is a frozen value that checks itself when it is made (pipeline.core.settings), so a wrong setting fails
before any file is read, named as its user wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.core.errors import MetricsSettingError
from pipeline.core.settings import check_flag, check_name, check_names, check_one_of, check_whole, is_number, is_whole

_UINT32 = 2**32


MAX_B = 10_000  # bootstrap replicates; measured on 200 rollouts: B = 10,000 peaks at 406 MB, 100,000 at 2.4 GB
# Replicate values one pass of the metrics holds (pipeline.metrics.cohorts.cohort_passes): cohorts of the pass × B ×
# (sum columns + PEC depths); the cohorts go a pass at a time, on one node and on Ray, so memory follows this, not
# the cohorts × B (1,000 cohorts × 1,000 replicates held at once took 5.2 GB).
PASS_REPLICATE_VALUES = 1_000_000
MAX_COHORT_COLUMNS = 64  # label columns a cohort is keyed by (every label of the run without --by)
MAX_K = 1000  # the largest depth k of PEC(k) asked for (`--max-k`, a job's `max_k`)
# Without --max-k, K is the run's largest T, at most DEFAULT_MAX_K and at least the depths the metrics table shows:
# past every rollout's length PEC(k) is 0 by definition, so the table's PEC@3 of a run of short rollouts says 0, not –.
DEFAULT_MAX_K = 20
TABLE_PEC_K = (1, 3)


def default_k(max_t: int | None) -> int:
    """K of PEC(k) without --max-k, from the run's largest T (None: the run has no rollout, K = 0)."""
    return 0 if max_t is None else max(min(max_t, DEFAULT_MAX_K), max(TABLE_PEC_K))


METHODS = ("multinomial", "poisson", "poisson-merged")
VIEW_PORT = 8765  # where `pexec view RUN` listens by default (`pexec guard serve` listens on another)
Method = Literal["multinomial", "poisson", "poisson-merged"]


@dataclass(frozen=True)
class BootstrapSettings:
    """The task-level bootstrap: B replicates (`--bootstrap`), the seed of its draws, its method, and the level
    of its percentile intervals. The keys its errors name are the options' (`bootstrap` for B)."""

    B: int = 1000  # at most MAX_B
    seed: int = 0
    method: Method = "multinomial"
    level: float = 0.95

    def __post_init__(self) -> None:
        if not is_whole(self.B) or not 1 <= self.B <= MAX_B:
            raise MetricsSettingError("bootstrap", f"bootstrap B must be 1 to {MAX_B:,}, got {self.B!r}")
        if not is_whole(self.seed) or not 0 <= self.seed < _UINT32:
            raise MetricsSettingError("seed", f"seed must be in [0, 2**32), got {self.seed!r}")
        check_one_of("method", self.method, METHODS, MetricsSettingError)
        if not is_number(self.level) or not 0 < self.level < 1:
            raise MetricsSettingError("level", f"level (of the intervals) must be in (0, 1), got {self.level!r}")

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
        check_one_of("harness_errors", self.harness_errors, ("exclude", "fail"), MetricsSettingError)
        seen: dict[str, str] = {}
        for name, benchmarks in self.pools:
            check_name("pool", name, False, MetricsSettingError)
            check_names("pool", benchmarks, MetricsSettingError)
            if not benchmarks:
                raise MetricsSettingError("pool", f"pool {name!r} names no benchmark")
            for b in benchmarks:
                if b in seen:
                    raise MetricsSettingError(
                        "pool", f"pool: benchmark {b!r} is in two pools: {seen[b]!r} and {name!r}"
                    )
                seen[b] = name
        check_flag("strict_replay", self.strict_replay, MetricsSettingError)

    @property
    def pooled(self) -> dict[str, str]:
        """benchmark -> the pool it is counted in."""
        return {b: name for name, benchmarks in self.pools for b in benchmarks}


DEFAULT_POPULATION = Population()


@dataclass(frozen=True)
class MetricsSettings:
    """What the metrics of a run are asked for: the cohort columns (`by`; None: every condition label), the
    bootstrap, the population counted, and the largest PEC depth (None: max T, at most 20).

    `pexec metrics` (and report, diff, view: the parts they take) and a job's [metrics] table make it the same
    way, from their flat values (`from_values`)."""

    by: tuple[str, ...] | None = None
    bootstrap: BootstrapSettings = DEFAULT_BOOTSTRAP
    population: Population = DEFAULT_POPULATION
    max_k: int | None = None

    def __post_init__(self) -> None:
        if self.by is not None:
            check_names("by", self.by, MetricsSettingError)
            object.__setattr__(self, "by", tuple(self.by))  # a job file's list, a command's columns
        if self.max_k is not None:
            check_whole("max_k", self.max_k, 0, MAX_K, MetricsSettingError)

    @classmethod
    def from_values(
        cls,
        *,
        by: Sequence[str] | None = None,
        bootstrap: int = DEFAULT_BOOTSTRAP.B,
        seed: int = DEFAULT_BOOTSTRAP.seed,
        method: str = DEFAULT_BOOTSTRAP.method,
        harness_errors: str = DEFAULT_POPULATION.harness_errors,
        pool: Mapping[str, Sequence[str]] | None = None,
        strict_replay: bool = DEFAULT_POPULATION.strict_replay,
        max_k: int | None = None,
        methods: Sequence[str] = METHODS,
    ) -> MetricsSettings:
        """The settings of the flat values a command's options or a job's [metrics] table hold, under the same
        names (`bootstrap` is B; `pool` maps a pool's name to its benchmarks). `methods`: the bootstrap methods
        the asking command computes (every one by default)."""
        check_one_of("method", method, methods, MetricsSettingError)
        if pool is not None and not isinstance(pool, Mapping):
            raise MetricsSettingError("pool", f"pool maps a pool's name to its benchmarks, got {pool!r}")
        for benchmarks in (pool or {}).values():
            check_names("pool", benchmarks, MetricsSettingError)  # before a string is taken apart as a sequence
        pools = tuple((name, tuple(benchmarks)) for name, benchmarks in (pool or {}).items())
        return cls(
            by,  # type: ignore[arg-type]  # any sequence of names (made a tuple), not a string (refused)
            # Both check their own values on being made (the method above too): a str is the Literal they take.
            BootstrapSettings(B=bootstrap, seed=seed, method=method),  # type: ignore[arg-type]
            Population(harness_errors, pools, strict_replay),  # type: ignore[arg-type]
            max_k,
        )


DEFAULT_METRICS = MetricsSettings()


def harness_note(cohorts: Sequence[Mapping[str, Any]]) -> str:
    """How harness-error rollouts (the harness never really ran them) entered the cohorts' numbers."""
    n = sum(c["n_harness_error"] for c in cohorts)
    if cohorts and cohorts[0]["harness_errors"] == "fail":
        return f"Harness errors: {n}, counted in N as non-executable failures (executable and success false)."
    return f"Harness errors: {n}, left out of N and of every metric (--harness-errors fail counts them as failures)."


def effects_note(cohorts: Sequence[Mapping[str, Any]]) -> str | None:
    """What "invalid irreversible" cannot see: calls of tools whose environment declares no effect class. Such a
    call is never counted irreversible, so where every rollout made one a 0 says nothing. None when every call of
    the cohorts has a class."""
    shares = [(c, c["unclassified"]["value"]) for c in cohorts if c.get("unclassified", {}).get("value")]
    if not shares:
        return None
    worst = max(v for _, v in shares)
    blind = "; in a cohort where every rollout did, its 0 says nothing" if worst >= 1 else ""
    return (
        f"Invalid irreversible counts only tools with a declared effect class: up to {100 * worst:.0f}% of a cohort's "
        f"rollouts called a tool without one (`unclassified` in --json){blind}."
    )


def replay_note(cohorts: Sequence[Mapping[str, Any]]) -> str:
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
