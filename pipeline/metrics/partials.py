"""Per-cohort metrics computed in Ray tasks (`pexec metrics --method poisson-merged --address RAY`): no process
reads every rollout, and the bounds are exactly those of the same metrics computed in one process.

Two stages of tasks, then a merge (docs/explanation/intervals.md, where each step runs):
  1. one task per rollouts part file (a scoring shard's output): the population and metrics_prepare.sql over that
     part alone give its per-(cohort, task) sums (sql/part_sums.sql), cut by a hash of the task into
     `partitions` tables, and its counts per cohort (rollouts, no-call, unknown success, diverged, harness errors);
  2. one task per partition: every part's rows of its tasks added up into whole-task sums (sql/partition_sums.sql;
     a task's rollouts may lie in several parts), then the task-keyed Poisson partial sums of those tasks
     (pipeline.metrics.bootstrap.poisson_partial), the tasks counted per cohort, and the exact integer moments
     of the per-task sums that the small-sample intervals need (sums over tasks, so they add up too);
  3. here: the counts and moments added, then a pass of cohorts at a time, the partitions' partial sums merged
     (pipeline.metrics.bootstrap.merge, exact integers) and turned into intervals by the same SQL as a single node
     (bootstrap_sums.sql, metrics_intervals.sql); then the cohort dicts.

Why partitions by task and not the parts' partial sums alone: a task's Poisson weight is keyed by the task, so
partial sums of any cut of the rollouts add up exactly; but the tasks counted per cohort and the moments (sums
of squares of whole-task sums) need each task's rollouts together. Only the poisson-merged bootstrap can be
distributed: the multinomial and Poisson draws number a cohort's tasks, which no part knows.

The per-tool profiles (pipeline.metrics.tool_partials) go through the same stages 2 and 3, over step-level cohorts.

Memory: a part task holds one part; a partition task its share of the (cohort, task) rows and the partial sums of
one pass of cohorts at a time (pipeline.metrics.cohorts.cohort_passes; it yields each pass's, which Ray stores as
it goes); this process holds the merged partial sums of one pass at a time, a few numbers per cohort and one
reference per (part, partition) and per (partition, pass), never a rollout or a task.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import duckdb
import numpy as np

from pipeline.core import metric_catalogue, ray_waits
from pipeline.core.arrow import pa
from pipeline.core.errors import MetricsError
from pipeline.metrics import bootstrap, cohorts
from pipeline.metrics._population import check_pools, open_part_population, open_population
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import fetch, run_sql, set_variables
from pipeline.metrics.results import Cohort, Key, Labels
from pipeline.metrics.settings import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_MAX_K,
    DEFAULT_POPULATION,
    BootstrapSettings,
    Population,
    default_k,
)
from pipeline.storage.run import RunPrefix

MAX_PARTITIONS = 64  # task partitions at most: each holds 1/64 of the (cohort, task) rows or less


class PartCount(TypedDict):
    """A row of table part_counts (sql/part_sums.sql): a cohort's counts in one part."""

    key: Labels
    n: int
    n_no_calls: int
    n_unknown_success: int


class Diverged(TypedDict):
    """A row of table cohort_diverged (sql/metrics_prepare.sql)."""

    key: Labels
    n_diverged_before_fed: int


class PartFacts(TypedDict):
    """The one row of table part_facts (sql/part_sums.sql)."""

    max_t: int | None  # None: the part has no rollout
    benchmarks: list[str] | None


class KeyRow(TypedDict):
    """A row of table partition_keys (sql/partition_sums.sql): the key of cohort number `code`, in code order."""

    key: Labels


@dataclass
class PartCounts:
    """What one part found that adds up across parts, per cohort key."""

    info: dict[Key, PartCount] = field(default_factory=dict)
    diverged: dict[Key, int] = field(default_factory=dict)  # n_diverged_before_fed, over every key of the part
    harness: dict[Key, int] = field(default_factory=dict)  # n_harness_error, over every scored rollout
    max_t: int | None = None
    benchmarks: set[str] = field(default_factory=set)

    def add(self, other: PartCounts) -> None:
        for key, row in other.info.items():
            mine = self.info.setdefault(key, {**row, "n": 0, "n_no_calls": 0, "n_unknown_success": 0})
            for name in ("n", "n_no_calls", "n_unknown_success"):
                mine[name] += row[name]
        for key, n in other.diverged.items():
            self.diverged[key] = self.diverged.get(key, 0) + n
        for key, n in other.harness.items():
            self.harness[key] = self.harness.get(key, 0) + n
        if other.max_t is not None:
            self.max_t = other.max_t if self.max_t is None else max(self.max_t, other.max_t)
        self.benchmarks |= other.benchmarks


@dataclass
class PartitionResult:
    """What one task partition returns first: per cohort key, its tasks and moments (its Poisson partial sums
    follow, a pass of cohorts each)."""

    tasks: dict[Key, int]
    metric_moments: dict[tuple[Key, str], bootstrap.Moments]  # (cohort key, ratio metric)
    pec_moments: dict[tuple[Key, int], bootstrap.Moments]  # (cohort key, k)

    def add(self, other: PartitionResult) -> None:
        """Merge another partition's result (disjoint tasks): tasks and moments add."""
        for k, n in other.tasks.items():
            self.tasks[k] = self.tasks.get(k, 0) + n
        _add_moments(self.metric_moments, other.metric_moments)
        _add_moments(self.pec_moments, other.pec_moments)


def _key(value: Labels) -> Key:
    return tuple(value.values())


def part_sums(
    root: RunPrefix,
    file: str,
    columns: pa.Schema,
    population: Population,
    cohort_cols: list[str],
    max_k: int,
    partitions: int,
) -> tuple[PartCounts | pa.Table, ...]:
    """Stage 1, one part file: its counts (PartCounts), then its per-(cohort key, task) sums in `partitions`
    tables (a tuple: the Ray task returns each as its own object)."""
    with open_part_population(root, file, columns, population) as con:
        set_variables(con, cohort_cols=cohort_cols, max_k=max_k, partitions=partitions)
        cohorts.prepare_sums(con)
        run_sql(con, "metrics/part_sums")
        run_sql(con, "metrics/harness_counts")
        counts = PartCounts()
        for row in fetch(con, "part_counts", PartCount):
            counts.info[_key(row["key"])] = row
        for diverged in fetch(con, "cohort_diverged", Diverged):
            counts.diverged[_key(diverged["key"])] = diverged["n_diverged_before_fed"]
        for harness in fetch(con, "harness_counts", cohorts.HarnessCount):
            counts.harness[_key(harness["key"])] = harness["n_harness_error"]
        facts = fetch(con, "part_facts", PartFacts)[0]
        counts.max_t, counts.benchmarks = facts["max_t"], set(facts["benchmarks"] or ())
        rows = con.sql("SELECT * FROM part_task_sums ORDER BY partition").to_arrow_table()
    cut = np.searchsorted(rows["partition"].to_numpy(), np.arange(partitions + 1))
    tables = [rows.slice(int(cut[p]), int(cut[p + 1] - cut[p])).drop_columns(["partition"]) for p in range(partitions)]
    return (counts, *tables)


def rollout_clusters(sums: cohorts.TaskSums, K: int) -> cohorts.Clusters:
    """The moments the rollout metrics' small-sample intervals need: per (cohort, ratio metric) and (cohort, k)."""
    return cohorts._metric_clusters(sums), cohorts._pec_clusters(sums, K)


def partition_result(
    columns: list[str],
    K: int,
    settings: BootstrapSettings,
    passes: dict[Key, int],
    clusters: Callable[[cohorts.TaskSums, int], cohorts.Clusters],
    *tables: pa.Table,
) -> Iterator[PartitionResult | bootstrap.PoissonPartial[Key]]:
    """Stage 2, one task partition: every part's rows of its tasks (`tables`) as whole-task sums; yields their
    tasks and moments per cohort key (`clusters`: rollout_clusters, or the tool profiles' own), then for each pass
    of cohorts (`passes`: a cohort key's pass number, every pass numbered) the Poisson partial sums of its cohorts.
    A generator: Ray stores each object as it is yielded, so the task holds one pass's partial sums at a time."""
    n_passes = max(passes.values(), default=-1) + 1
    filled = [t for t in tables if t.num_rows]
    if not filled:
        yield PartitionResult({}, {}, {})
        for _ in range(n_passes):
            yield bootstrap.PoissonPartial(settings.seed, settings.B, tuple(columns), {})
        return
    rows = pa.concat_tables(filled, promote_options="default")  # a depth no rollout of a part reached: no column
    con = duckdb.connect()
    try:
        run_sql(con, "metrics/hash")
        con.register("partition_rows", rows)
        run_sql(con, "metrics/partition_sums")
        del rows
        keys = [_key(r["key"]) for r in fetch(con, "partition_keys", KeyRow)]
        table = con.sql("SELECT * EXCLUDE (key) FROM partition_sums").to_arrow_table()
    finally:
        con.close()
    code = table["code"].to_numpy()
    task_key = table["task_key"].to_numpy()
    sums = np.zeros((len(code), len(columns)), dtype=np.int64)  # a depth no part reached: no column, 0 rollouts
    for j, name in enumerate(columns):
        if name in table.column_names:
            sums[:, j] = table[name].to_numpy()
    del table
    split = np.searchsorted(code, np.arange(1, len(keys)))
    task_sums = cohorts.TaskSums(columns, np.split(sums, split))
    by_metric, by_depth = clusters(task_sums, K)
    metric_moments = {(keys[c], name): m for (c, name), m in by_metric.items()}
    pec_moments = {(keys[c], k): m for (c, k), m in by_depth.items()}
    yield PartitionResult(
        {k: len(s) for k, s in zip(keys, task_sums.cohorts, strict=True)}, metric_moments, pec_moments
    )
    row_pass = np.array([passes[k] for k in keys], dtype=np.int64)[code]
    by_pass = np.argsort(row_pass, kind="stable")  # the rows of each pass together, in code order within it
    bounds = np.searchsorted(row_pass[by_pass], np.arange(n_passes + 1))
    for number in range(n_passes):
        rows_in = by_pass[bounds[number] : bounds[number + 1]]
        codes = np.unique(code[rows_in])  # this partition's cohorts of the pass, in code order
        yield bootstrap.poisson_partial(
            [keys[c] for c in codes], np.searchsorted(codes, code[rows_in]), task_key[rows_in], sums[rows_in],
            columns, settings.seed, settings.B,
        )  # fmt: skip


@functools.cache
def remote_function(function: Callable[..., object]) -> Any:
    import ray

    return ray.remote(function)  # a Ray remote function (Ray's types do not follow `options`)


def start_ray(address: str) -> None:
    """Connect to the Ray at `address` ("local": start one in this process, as `pexec score` does by default)."""
    from pipeline.core.ray_start import start_ray as start

    start(None if address == "local" else address)


def partition_count(parts: int) -> int:
    return max(1, min(parts, MAX_PARTITIONS))


def metrics_on_ray(
    snapshot: Snapshot,
    address: str,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    population: Population = DEFAULT_POPULATION,
    replicated: Sequence[str] = (),
    partitions: int | None = None,
) -> tuple[list[Cohort], cohorts.Replicates]:
    """pipeline.metrics.cohorts.metrics_and_replicates with the poisson-merged bootstrap, computed in Ray tasks
    (the Ray at `address`); the same cohorts, bounds and replicates."""

    if settings.method != "poisson-merged":
        raise MetricsError(
            f"metrics on Ray need --method poisson-merged (its draws are keyed by task, so parts of the run can "
            f"be summed apart); {settings.method} numbers a cohort's tasks, which no part knows"
        )
    if max_k is not None and max_k < 0:
        raise MetricsError(f"max_k must be >= 0, got {max_k}")
    # Here only the parts' footers are read: the run's columns, hence the cohort columns.
    with open_population(snapshot, population, check=False) as con:
        by_cols = cohorts.cohort_columns(con, by)
        columns = con.sql("SELECT * FROM run_rollouts LIMIT 0").to_arrow_table().schema
    files = snapshot.parts("rollouts")
    n_parts = partitions or partition_count(len(files))
    start_ray(address)
    cohort_cols = ["benchmark", *by_cols]
    first_k = DEFAULT_MAX_K if max_k is None else max_k  # before the run's largest T is known
    stage1 = remote_function(part_sums).options(num_returns=n_parts + 1)
    outputs = [stage1.remote(snapshot.root, f, columns, population, cohort_cols, first_k, n_parts) for f in files]
    counts = PartCounts()
    for got in ray_waits.get([o[0] for o in outputs]):
        counts.add(got)
    check_pools(counts.benchmarks, population, snapshot.root.url)
    K = max_k if max_k is not None else default_k(counts.max_t)
    sum_columns = [f"s_{p.name}" for p in metric_catalogue.PARTS]
    sum_columns += [f"s_h{d}" for d in range(1, min(K, counts.max_t or 0) + 1)]
    keys = sorted(counts.info, key=lambda k: tuple((v is None, v) for v in k))  # the cohort numbers' order
    passes = cohorts.cohort_passes(len(keys), settings.B, len(sum_columns), K)
    pass_of = {keys[c]: number for number, cohort_range in enumerate(passes) for c in cohort_range}
    stage2 = remote_function(partition_result).options(num_returns=1 + len(passes))
    # Per partition, its first object and one per pass (Ray gives a lone object, not a list, when there is no pass).
    outputs2 = [
        object_list(stage2.remote(sum_columns, K, settings, pass_of, rollout_clusters, *(o[1 + p] for o in outputs)))
        for p in range(n_parts)
    ]
    del outputs
    watch = ray_waits.NodeWatch()
    merged = merge_first(outputs2, watch)
    return _merged(counts, keys, merged, outputs2, passes, by_cols, sum_columns, K, settings, population, replicated,
                   snapshot, watch)  # fmt: skip


def merge_first(outputs: list[list[Any]], watch: ray_waits.NodeWatch) -> PartitionResult:
    """The partitions' first objects (tasks and moments) added up as each partition finishes: this process holds
    one partition's result at a time."""
    merged = PartitionResult({}, {}, {})
    pending = [o[0] for o in outputs]
    while pending:
        done, pending = ray_waits.wait(pending, watch=watch)
        merged.add(ray_waits.get(done[0], watch))
    return merged


def _merged(
    counts: PartCounts,
    keys: list[Key],
    result: PartitionResult,
    outputs: list[Any],
    passes: list[range],
    by_cols: list[str],
    sum_columns: list[str],
    K: int,
    settings: BootstrapSettings,
    population: Population,
    replicated: Sequence[str],
    snapshot: Snapshot,
    watch: ray_waits.NodeWatch,
) -> tuple[list[Cohort], cohorts.Replicates]:
    """The partitions' results merged into the cohort dicts, their intervals taken a pass of cohorts at a time
    (pass_rows)."""
    code = {k: i for i, k in enumerate(keys)}
    tasks, metric, pec = result.tasks, result.metric_moments, result.pec_moments
    info: list[cohorts.CohortInfo] = [
        {"cohort": code[k], "key": counts.info[k]["key"], "n": counts.info[k]["n"], "n_tasks": tasks.get(k, 0),
         "n_no_calls": counts.info[k]["n_no_calls"], "n_unknown_success": counts.info[k]["n_unknown_success"],
         "n_diverged_before_fed": counts.diverged.get(k, 0)}
        for k in keys
    ]  # fmt: skip
    names = ["benchmark", *by_cols]
    harness: list[cohorts.HarnessCount] = [
        {"key": dict(zip(names, k, strict=True)), "n_harness_error": n} for k, n in counts.harness.items()
    ]
    clusters = (
        {(code[k], name): m for (k, name), m in metric.items()},
        {(code[k], d): m for (k, d), m in pec.items() if d <= K},
    )
    variables = {"pexec_k": K, "metric_defs": cohorts.metric_defs(), "replicated": list(replicated),
                 "parts": [f"s_{p.name}" for p in metric_catalogue.PARTS]}  # fmt: skip
    rows = pass_rows(outputs, passes, code, sum_columns, settings, variables, watch)
    return cohorts.intervals_and_replicates(
        rows, info, clusters, harness, by_cols, settings, population, replicated, snapshot
    )


def pass_rows(
    outputs: list[list[Any]],
    passes: list[range],
    code: dict[Key, int],
    sum_columns: list[str],
    settings: BootstrapSettings,
    variables: dict[str, object],
    watch: ray_waits.NodeWatch,
) -> cohorts.IntervalRows:
    """The intervals of every cohort, a pass at a time: each pass's partial sums of every partition (`outputs`: per
    partition, its object refs after the first) merged one partition at a time, their intervals taken by the SQL of
    a single node (`variables`: those metrics_intervals.sql names besides the bootstrap's and the pass's), and the
    pass's objects let go. `code`: each cohort key's number, in key order."""
    rows = cohorts.IntervalRows()
    con = duckdb.connect()
    try:
        set_variables(con, **settings.sql_variables, **variables)
        con.register("sum_columns", pa.schema([(c, pa.int64()) for c in ["cohort", *sum_columns]]).empty_table())
        run_sql(con, "metrics/merged_sums")
        con.unregister("sum_columns")
        for number, cohort_range in enumerate(passes):
            partial: bootstrap.PoissonPartial[Key] = bootstrap.PoissonPartial(
                settings.seed, settings.B, tuple(sum_columns), {}
            )
            for o in outputs:  # one partition's partial sums at a time beside the merged ones
                partial = bootstrap.merge([partial, ray_waits.get(o[1 + number], watch)])
                o[1 + number] = None  # read: the object store may free it
            by_code = bootstrap.PoissonPartial(partial.seed, partial.B, partial.columns,
                                               {code[k]: s for k, s in partial.sums.items()})  # fmt: skip
            wide, limbs = bootstrap.partial_tables(by_code, plain=True)
            del partial, by_code
            cohorts.bootstrap_sums(con, wide, limbs)
            del wide, limbs
            set_variables(con, pass_first=cohort_range.start, pass_end=cohort_range.stop)
            rows.extend(cohorts.interval_rows(con))
    finally:
        con.close()
    return rows


def object_list(refs: Any) -> list[Any]:
    """A task's object refs as a list (Ray gives a lone ref, not a list, for num_returns=1)."""
    return refs if isinstance(refs, list) else [refs]


Where = TypeVar("Where")


def _add_moments(into: dict[Where, bootstrap.Moments], moments: dict[Where, bootstrap.Moments]) -> None:
    for key, m in moments.items():
        into[key] = into[key] + m if key in into else m
