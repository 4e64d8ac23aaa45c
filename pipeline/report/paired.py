"""Paired comparison of two conditions (`--compare COL=A COL=B`): sql/paired_*.sql give, per pair (benchmark
and the other condition labels), A, B and A - B of every metric over the tasks both share, with a paired
task-level bootstrap interval of the difference (cost: change of the mean in %), none where either side's
denominator is below the small-sample floor of pipeline.core.intervals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from pipeline.core import intervals
from pipeline.core.errors import ReportError
from pipeline.core.text import some
from pipeline.metrics.cohorts import cohort_columns, metric_defs
from pipeline.metrics.duck import cost_columns, fetch, run_sql, set_variables
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_POPULATION, BootstrapSettings, Population


class PairedRow(TypedDict):
    """A row of table paired_intervals (sql/paired_bootstrap.sql), after its pair's values (benchmark and the other
    condition labels): A, B and the contrast of one metric or cost over the tasks both conditions share."""

    metric: str  # a catalogue metric, `pec@<k>`, or a cost column
    kind: Literal["diff", "pct"]  # the contrast: A − B, or the change of the mean in % of B (costs)
    shared_tasks: int
    den_tasks: int  # of the shared tasks, those with a nonzero denominator (the smaller side's count)
    den_total: int  # the denominator's total over them (the smaller side's)
    small_sample: bool  # below the task bootstrap's floor (pipeline.core.intervals): no interval
    value_a: float | None
    value_b: float | None
    value: float | None
    lo: float | None
    hi: float | None
    replicates_used: int


class _Side(TypedDict):
    side: Literal["A", "B"]


class _Value(TypedDict):
    value: str
    n: int


SHOWN_VALUES = 10  # values of the compared column an error lists, the rest counted


@dataclass(frozen=True)
class Compare:
    column: str
    a: str
    b: str

    @property
    def title(self) -> str:
        return f"{self.column}: {self.a} − {self.b}"


def parse_compare(items: Sequence[str]) -> Compare:
    """`["method=dual_loop", "method=plan_react"]` -> Compare("method", "dual_loop", "plan_react")."""
    if len(items) != 2:
        raise ReportError(f"--compare takes exactly two COL=VALUE arguments (A then B), got {len(items)}")
    pairs = []
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column or not value:
            raise ReportError(f"--compare takes COL=VALUE, got {item!r}")
        pairs.append((column, value))
    (col_a, a), (col_b, b) = pairs
    if col_a != col_b:
        raise ReportError(f"--compare must name the same column twice, got {col_a!r} and {col_b!r}")
    if a == b:
        raise ReportError(f"--compare needs two different values of {col_a!r}, got {a!r} twice")
    return Compare(col_a, a, b)


def paired_comparison(
    run: Run,
    compare: Compare,
    keys: Sequence[str],
    ks: Sequence[int],
    settings: BootstrapSettings,
    population: Population = DEFAULT_POPULATION,
) -> tuple[list[str], list[PairedRow]]:
    """(pair key columns, one row per pair and metric). `keys` are the report's cohort columns."""
    check_paired_method(settings)
    with run.connect(population) as con:
        # raises when it is not a label or attribute; an attribute comes back as its column (attr_<name>)
        column = next(iter(cohort_columns(con, [compare.column])), compare.column)
        pair_cols = [k for k in keys if k != column]
        set_variables(
            con,
            **settings.sql_variables,
            pair_cols=pair_cols,
            compare_col=column,
            compare_a=compare.a,
            compare_b=compare.b,
            ks=[int(k) for k in ks],
            metric_defs=metric_defs(paired=True),
            method=settings.method,
            min_tasks=intervals.MIN_TASKS,
            min_denominator=intervals.MIN_DENOMINATOR,
        )
        run_sql(con, "report/paired_prepare")
        sides = {r["side"] for r in fetch(con, "paired_sides", _Side)}
        for side, value in (("A", compare.a), ("B", compare.b)):
            if side not in sides:
                run_sql(con, "report/paired_values")
                present = [repr(r["value"]) for r in fetch(con, "paired_values", _Value)]
                there = f"values present: {some(present, SHOWN_VALUES)}" if present else "no rollout has a value"
                raise ReportError(f"no rollouts with {compare.column}={value!r} ({there})")
        if cost_columns(con):
            run_sql(con, "report/paired_costs")
        run_sql(con, "report/paired_bootstrap")
        return pair_cols, fetch(con, "paired_intervals", PairedRow)


def check_paired_method(settings: BootstrapSettings) -> None:
    """report/sql/paired_bootstrap.sql draws the multinomial and Poisson replicates only."""
    if settings.method not in ("multinomial", "poisson"):
        raise ReportError(f"the paired comparison takes --method multinomial or poisson, not {settings.method}")
