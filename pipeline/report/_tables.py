"""The report's numbers per cohort: the metrics with intervals (pipeline.metrics.cohorts) joined with the descriptive
tables of report/sql/report_tables.sql and report/sql/report_costs.sql (recovery arithmetic, first causes, FED
histogram, mean costs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import duckdb

from pipeline.core import metric_catalogue
from pipeline.metrics.cohorts import Replicates, cohort_columns
from pipeline.metrics.duck import cost_columns, fetch, rollout_columns, run_sql, set_variables
from pipeline.metrics.results import Cohort, Labelled
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_POPULATION, BootstrapSettings, Population


class Recovery(Labelled):
    """A row of table report_recovery: a cohort's counts behind success = TER_v · P(success | executable) +
    (1 − TER_v) · RR."""

    n: int
    n_unknown_success: int
    n_with_verdict: int
    n_executable_with_verdict: int
    n_executable_success: int
    n_invalid_prefix: int
    n_invalid_prefix_with_verdict: int
    n_invalid_prefix_success: int
    n_success: int
    share_successes_after_invalid_prefix: float | None


class CauseShare(Labelled):
    """A row of table report_causes: rollouts whose first invalid call has `cause` ("unknown": none recorded)."""

    cause: str
    n: int
    share: float  # of the cohort's rollouts with an invalid prefix


class FedShare(Labelled):
    """A row of table report_fed: rollouts by first-error depth (None for the executable ones)."""

    executable: bool
    fed: int | None
    n: int
    share: float  # of the cohort's rollouts


class CostMean(Labelled):
    """A row of table report_costs: the mean of a cost column (`cost_<name>`) over the rollouts that log it."""

    cost: str
    mean: float | None
    n_known: int


class UserCalls(Labelled):
    """A row of table report_users: the user simulator's own calls in a cohort (dual control: τ telecom)."""

    n_with_user_calls: int
    n_user_calls: int
    n_user_invalid: int
    n_user_executable: int


class SensitivityCount(Labelled):
    """A row of table report_sensitivity: rollouts whose looser-level depth a rescoring could change."""

    n: int
    n_approx_schema_dependency: int
    n_approx_schema: int


class _Depth(TypedDict):
    max_t: int


@dataclass(frozen=True)
class Descriptive:
    """The descriptive tables of a run, per cohort (report/sql/report_tables.sql, report_costs.sql)."""

    recovery: list[Recovery]
    causes: list[CauseShare]
    fed: list[FedShare]
    costs: list[CostMean]  # empty when the logs carry no cost_* column
    max_t: int
    users: list[UserCalls]  # empty when no user simulator made calls of its own


@dataclass(frozen=True)
class RunTables(Descriptive):
    """Everything the report shows, per cohort: the descriptive tables and the metrics. Rows are dicts whose first
    fields are the cohort keys (pipeline.metrics.results.key_values reads them)."""

    keys: list[str]  # benchmark + the condition labels (and attribute columns, when asked for)
    cohorts: list[Cohort]  # compute_metrics' cohort dicts (intervals, PEC curve, bootstrap settings)
    replicates: Replicates  # per cohort: success and the ranked metrics per bootstrap replicate (the ranking's)


def descriptive(con: duckdb.DuckDBPyConnection, keys: list[str]) -> Descriptive:
    set_variables(con, cohort_cols=keys)
    run_sql(con, "report/report_tables")
    costs: list[CostMean] = []
    if cost_columns(con):
        run_sql(con, "report/report_costs")
        costs = fetch(con, "report_costs", CostMean)
    users: list[UserCalls] = []
    if "user_T" in rollout_columns(con):
        run_sql(con, "report/report_users")
        users = fetch(con, "report_users", UserCalls)
    return Descriptive(
        recovery=fetch(con, "report_recovery", Recovery),
        causes=fetch(con, "report_causes", CauseShare),
        fed=fetch(con, "report_fed", FedShare),
        costs=costs,
        max_t=fetch(con, "report_depth", _Depth)[0]["max_t"],
        users=users,
    )


def run_tables(
    run: Run,
    by: Sequence[str] | None,
    ks: Sequence[int],
    settings: BootstrapSettings,
    population: Population = DEFAULT_POPULATION,
    address: str | None = None,
) -> RunTables:
    """The report's tables of `run`. `address`: its metrics computed in Ray tasks on the Ray there
    (pipeline.metrics.partials; the poisson-merged bootstrap, the same numbers)."""
    with run.connect(population) as con:
        keys = ["benchmark", *cohort_columns(con, by)]
        parts = descriptive(con, keys)
    # PEC is computed up to the largest requested k, and at least as far as the curves go (max T, <= 20).
    max_k = max([*ks, min(parts.max_t, 20)])
    ranked = ["success", *(m.name for m in metric_catalogue.ratios() if m.ranked)]
    cohorts, replicates = run.cohorts_and_replicates(keys[1:], settings, max_k, population, ranked, address)
    return RunTables(
        keys=keys,
        cohorts=cohorts,
        recovery=parts.recovery,
        causes=parts.causes,
        fed=parts.fed,
        costs=parts.costs,
        max_t=parts.max_t,
        users=parts.users,
        replicates=replicates,
    )
