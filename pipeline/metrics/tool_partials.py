"""Per-tool profiles computed in Ray tasks (`address` of pipeline.metrics.tool_profiles's callers: `pexec diff`, the
report, a job's diff): no process reads every call, and the profiles are exactly those of one node with the
poisson-merged bootstrap.

The stages of pipeline.metrics.partials, over step-level cohorts (benchmark × tool [× actor] [× labels]):
  1. one task per shard: its rollouts part and its steps part (a rollout's calls are written with it), through the
     population and sql/tool_prepare.sql alone, give its per-(cohort key, task) sums cut into task partitions
     (sql/tool_part_sums.sql), and per cohort key its calls, invalid calls, first errors and causes, which add up;
  2. one task per partition: whole-task sums, tasks counted per cohort, the moments of the tool metrics and the
     Poisson partial sums a pass of cohorts at a time (partials.partition_result);
  3. here: the counts added, the passes merged and their intervals taken (partials.pass_rows), then the profiles as
     one node assembles them (tool_profiles.assemble).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.core import ray_waits
from pipeline.core.arrow import pa
from pipeline.core.errors import MetricsError
from pipeline.metrics import cohorts, partials, tool_profiles
from pipeline.metrics._population import check_pools, open_part_population, open_population
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import fetch, run_sql, set_variables
from pipeline.metrics.results import CauseCount, Key, ToolProfile
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, DEFAULT_POPULATION, BootstrapSettings, Population
from pipeline.metrics.tool_profiles import ToolInfo
from pipeline.storage.run import RunPrefix


@dataclass
class ToolCounts:
    """What one shard found that adds up across shards, per cohort key (n_tasks and `cohort` are left to the
    partitions and the merge)."""

    info: dict[Key, ToolInfo] = field(default_factory=dict)
    causes: dict[Key, dict[str, int]] = field(default_factory=dict)
    benchmarks: set[str] = field(default_factory=set)

    def add(self, other: ToolCounts) -> None:
        for key, row in other.info.items():
            mine = self.info.setdefault(key, {**row, "n_calls": 0, "n_invalid": 0, "n_first_errors": 0})
            for name in ("n_calls", "n_invalid", "n_first_errors"):
                mine[name] += row[name]
        for key, causes in other.causes.items():
            into = self.causes.setdefault(key, {})
            for cause, n in causes.items():
                into[cause] = into.get(cause, 0) + n
        self.benchmarks |= other.benchmarks


def shard_sums(
    root: RunPrefix,
    rollouts_file: str,
    steps_file: str,
    columns: pa.Schema,
    population: Population,
    keys: list[str],
    partitions: int,
) -> tuple[ToolCounts | pa.Table, ...]:
    """Stage 1, one shard: its counts (ToolCounts), then its per-(cohort key, task) sums in `partitions` tables."""
    with open_part_population(root, rollouts_file, columns, population) as con:
        set_variables(con, steps_files=[steps_file], cohort_cols=keys, partitions=partitions)
        run_sql(con, "metrics/view_steps")
        run_sql(con, "metrics/tool_prepare")
        run_sql(con, "metrics/tool_part_sums")
        counts = ToolCounts()
        for row in fetch(con, "tool_info", ToolInfo):
            key = tuple(row["key"].values())
            counts.causes[key] = {c["cause"]: c["n"] for c in row["causes"]}
            counts.info[key] = {**row, "causes": []}  # the causes travel once, as counts that add up
        counts.benchmarks = {r[0] for r in con.sql("SELECT DISTINCT benchmark FROM run_rollouts").fetchall()}
        rows = con.sql("SELECT * FROM part_task_sums ORDER BY partition").to_arrow_table()
    cut = np.searchsorted(rows["partition"].to_numpy(), np.arange(partitions + 1))
    tables = [rows.slice(int(cut[p]), int(cut[p + 1] - cut[p])).drop_columns(["partition"]) for p in range(partitions)]
    return (counts, *tables)


def profiles_on_ray(
    snapshot: Snapshot,
    address: str,
    by: Sequence[str] | None = (),
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    population: Population = DEFAULT_POPULATION,
    replicates: bool = True,
) -> tuple[list[ToolProfile], list[np.ndarray]]:
    """pipeline.metrics.tool_profiles.profiles_and_replicates with the poisson-merged bootstrap, computed in Ray
    tasks (the Ray at `address`); the same profiles, bounds and replicates."""
    if settings.method != "poisson-merged":
        raise MetricsError(
            f"per-tool profiles on Ray need --method poisson-merged (its draws are keyed by task, so parts of the "
            f"run can be summed apart); {settings.method} numbers a cohort's tasks, which no part knows"
        )
    rollouts, steps = snapshot.parts("rollouts"), snapshot.parts("steps")
    with open_population(snapshot, population, check=False) as con:
        keys = tool_profiles.profile_keys(con, by)
        columns = con.sql("SELECT * FROM run_rollouts LIMIT 0").to_arrow_table().schema
    if not steps:
        return [], []
    if len(rollouts) != len(steps):  # each shard writes both: a run missing one is damaged
        raise MetricsError(f"{snapshot.root.url}: {len(rollouts)} rollouts parts but {len(steps)} steps parts")
    n_parts = partials.partition_count(len(rollouts))
    partials.start_ray(address)
    stage1 = partials.remote_function(shard_sums).options(num_returns=n_parts + 1)
    outputs = [
        stage1.remote(snapshot.root, r, s, columns, population, keys, n_parts)
        for r, s in zip(rollouts, steps, strict=True)
    ]
    counts = ToolCounts()
    for got in ray_waits.get([o[0] for o in outputs]):
        counts.add(got)
    check_pools(counts.benchmarks, population, snapshot.root.url)
    ordered = sorted(counts.info, key=lambda k: tuple((v is None, v) for v in k))  # the cohort numbers' order
    passes = cohorts.cohort_passes(len(ordered), settings.B, len(tool_profiles.PARTS), 0)
    pass_of = {ordered[c]: number for number, cohort_range in enumerate(passes) for c in cohort_range}
    stage2 = partials.remote_function(partials.partition_result).options(num_returns=1 + len(passes))
    tables = [[o[1 + p] for o in outputs] for p in range(n_parts)]  # per partition, every shard's rows of it
    del outputs
    clusters = tool_profiles.clusters
    outputs2 = [
        partials.object_list(stage2.remote(tool_profiles.PARTS, 0, settings, pass_of, clusters, *t)) for t in tables
    ]
    del tables
    watch = ray_waits.NodeWatch()
    merged = partials.merge_first(outputs2, watch)
    code = {k: i for i, k in enumerate(ordered)}
    rows = partials.pass_rows(outputs2, passes, code, tool_profiles.PARTS, settings,
                              tool_profiles.interval_variables(replicates), watch)  # fmt: skip
    info: list[ToolInfo] = [
        {**counts.info[k], "cohort": code[k], "n_tasks": merged.tasks.get(k, 0), "causes": _causes(counts.causes[k])}
        for k in ordered
    ]
    moments = {(code[k], name): m for (k, name), m in merged.metric_moments.items()}
    return tool_profiles.assemble(info, rows, keys, settings, moments, snapshot.partial(), replicates)


def _causes(counts: dict[str, int]) -> list[CauseCount]:
    """As sql/tool_prepare.sql lists them: most frequent first, then by name."""
    return [{"cause": c, "n": n} for c, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
