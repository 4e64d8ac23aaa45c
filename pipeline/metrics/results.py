"""What the metrics stage gives its users, key by key: one JSON-ready dict per cohort (`pexec metrics --json`,
`Run.cohorts()`) and per tool (`pexec metrics --by tool --json`, `Run.tool_profiles()`).

They are plain dicts, as users receive them; these TypedDicts say what each key holds. A row's first keys are its
cohort's values: `benchmark`, then the condition labels (or attributes) it was grouped by (`Labelled`). Those
after `benchmark` are the run's own column names, which a TypedDict cannot declare: a row is made by `labelled` (its
one unchecked step) and its cohort read back by `key_values`. tests/test_catalogue.py checks that the declared keys
are the ones the code writes besides the catalogue's metrics (cohort_fields,
pipeline.metrics.tool_profiles.TOOL_FIELDS).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, NotRequired, TypedDict, TypeVar, cast

from pipeline.core import metric_catalogue, run_schema
from pipeline.core.intervals import Method as IntervalMethod
from pipeline.metrics.completeness import CoverageJSON
from pipeline.metrics.settings import HarnessErrors, Method

Labels = dict[str, str | None]  # a cohort's key: cohort column (benchmark, labels, attributes) -> its value
Key = tuple[str | None, ...]  # the same values in the order of the cohort columns


def cohort_fields() -> tuple[str, ...]:
    """The keys of a cohort dict besides its label values (a label may not take one of these names)."""
    counts = (c.name for c in (*run_schema.COHORT_COUNTS, *run_schema.POPULATION))
    return (*counts, *(m.name for m in metric_catalogue.METRICS), "bootstrap", "partial")


class Interval(TypedDict):
    """A metric's value with its 95% interval: the task bootstrap's percentiles, or Wilson on the effective sample
    size where they say nothing (pipeline.core.intervals). All None where the value is undefined."""

    value: float | None
    lo: float | None
    hi: float | None
    method: NotRequired[IntervalMethod]  # absent where there is no value, and for PEC(0) = 1, true by definition
    eligible: NotRequired[int]  # the denominator's count, for the metrics that show it (Metric.eligible)
    # fewer than MIN_TASKS tasks or MIN_DENOMINATOR units in the denominator (pipeline.core.intervals): set with
    # `method`; a contrast of two runs gives no bootstrap interval then
    small_sample: NotRequired[bool]


class PecPoint(Interval):
    """PEC(k) at one depth k."""

    k: int


class BootstrapInfo(TypedDict):
    """How the intervals were drawn (pipeline.metrics.settings.BootstrapSettings), recorded with every result."""

    B: int
    seed: int
    method: Method
    level: float
    unit: Literal["task"]  # the resampled unit


class CohortBootstrap(BootstrapInfo):
    duckdb_version: str


class Labelled(TypedDict):
    """A row of a cohort: its benchmark (or pool), then its other cohort columns' values (str or None), undeclared."""

    benchmark: str


class Cohort(Labelled):
    """One cohort's metrics (pipeline.metrics.cohorts.compute_metrics), after its label values: the counts of
    pipeline.core.run_schema.COHORT_COUNTS and POPULATION, then one entry per metric of the catalogue
    (pipeline.core.metric_catalogue, in its order), then the bootstrap settings and what a partial read covers.

    The metrics are declared once, in the catalogue: each ratio metric's entry is an Interval under its name
    (`ratio` reads it), and the one curve is `pec`."""

    n: int  # started rollouts the metrics count
    n_tasks: int
    n_no_calls: int
    n_unknown_success: int
    n_diverged_before_fed: int
    n_harness_error: int  # counted over every scored rollout, counted in N or not
    harness_errors: HarnessErrors
    strict_replay: bool
    n_rejected_in_run: int  # the run's records rejected at scoring (in no cohort), the same on every cohort
    pec: list[PecPoint]  # PEC(k), k = 0 .. K
    bootstrap: CohortBootstrap
    partial: CoverageJSON | None  # None for a complete run


class CauseCount(TypedDict):
    cause: str  # a first-error cause (pipeline.core.model.CAUSES), or "unknown"
    n: int


class ToolProfile(Labelled):
    """One tool's error profile in a cohort (pipeline.metrics.tool_profiles): benchmark, tool, then the `by`
    labels' values, then these."""

    tool: str
    n_calls: int
    n_tasks: int
    n_invalid: int
    n_first_errors: int  # calls that were their rollout's first invalid call
    causes: list[CauseCount]  # of the invalid calls, most frequent first
    first_error_share: float | None  # of the first errors of the benchmark [× labels], the share at this tool
    invalid_rate: Interval
    output_match: Interval
    bootstrap: BootstrapInfo
    partial: CoverageJSON | None


Row = TypeVar("Row", bound=Mapping[str, object])


def labelled(labels: Mapping[str, str | None], fields: Row) -> Row:
    """`fields` after the cohort's label values `labels` (a label never takes a field's name: cohort_columns
    refuses one that would). The label keys are not part of `fields`' type: the checker keeps seeing that."""
    return cast(Row, {**labels, **fields})  # the TypedDict of `fields` plus keys it cannot declare


def key_values(row: Mapping[str, object], keys: Iterable[str]) -> Key:
    """A row's cohort values for `keys`, as text (None where missing or NULL): what rows of different tables (and
    runs) are matched on."""
    return tuple(None if row.get(k) is None else str(row[k]) for k in keys)


def ratio(cohort: Cohort, name: str) -> Interval:
    """The interval of the catalogue's ratio metric `name` (pipeline.core.metric_catalogue.ratios()), a key of
    the cohort that only the catalogue declares."""
    entries: Mapping[str, object] = cohort
    return cast(Interval, entries[name])  # compute_metrics puts an Interval under every ratio metric's name
