"""`pexec diff RUN_A RUN_B`: drift between two runs whose task sets differ (nightly production logs never share
task ids), docs/explanation/intervals.md.

Per cohort (benchmark × `by` labels) and ratio metric of the catalogue: A, B and the difference B − A with a two-sample
task-level bootstrap interval. Each run's tasks are resampled on their own (pipeline.metrics.cohorts's draws, seed S for
A and S XOR SEED_B for B, so the two samples never share a draw sequence), replicate b's difference is B_b − A_b, and
the interval is the percentile interval of those differences. Per tool: the change of the invalid rate
(pipeline.metrics.tool_profiles, the same two-sample bootstrap over step-level cohorts); tools new in B, tools gone from
B, and causes new in B.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, TypedDict

import duckdb
import numpy as np

from pipeline.core import metric_catalogue
from pipeline.core.errors import DiffError
from pipeline.core.text import label_text
from pipeline.metrics.results import (
    CauseCount,
    Interval,
    Key,
    Labels,
    ToolProfile,
    cohort_fields,
    key_values,
    labelled,
    ratio,
)
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, DEFAULT_POPULATION, BootstrapSettings, Population
from pipeline.metrics.shared_tasks import shared_tasks
from pipeline.metrics.tool_profiles import TOOL_FIELDS

SEED_B = 0x9E3779B9  # B's draws: seed XOR this (a fixed, recorded offset: A and B are independent samples)
TOOL_METRIC: Final = "invalid_rate"  # the per-tool metric a --fail-on can name
# A difference this close to a threshold is taken as equal to it. B − A subtracts two ratios rounded to doubles:
# 0.5 − 13/25 gives −0.020000000000000018, so a drop of exactly 0.02 would fire `ter<-0.02` and miss `ter<=-0.02` if
# compared as computed. The margin is far above that rounding (~1e-16) and far below the 4 decimals a diff prints.
EQUAL_WITHIN: Final = 1e-9


@dataclass(frozen=True)
class Threshold:
    """`metric op number` from --fail-on: a breach when the point difference B − A compares true."""

    metric: str
    op: str
    value: float

    def breached(self, diff: float | None) -> bool:
        if diff is None:
            return False
        if abs(diff - self.value) <= EQUAL_WITHIN:
            diff = self.value  # the threshold itself: `<` does not fire, `<=` does
        return _OPS[self.op](diff, self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_THRESHOLD = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>)\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*$")


def parse_threshold(text: str) -> Threshold:
    """`ter<-0.02`: a catalogue ratio metric (or `invalid_rate`, per tool), <, <=, > or >=, a number. Parsed by
    one regular expression; nothing is evaluated."""
    metric, op, number = split_threshold(text)
    names = [m.name for m in metric_catalogue.ratios()] + [TOOL_METRIC]
    if metric not in names:
        raise DiffError(f"--fail-on: unknown metric {metric!r}; one of {', '.join(names)}")
    return Threshold(metric, op, number)


def split_threshold(text: str) -> tuple[str, str, float]:
    """(metric, operator, number) of `METRIC<NUMBER`; the metric name is checked by the caller."""
    match = _THRESHOLD.match(text)
    if match is None:
        raise DiffError(f"--fail-on takes METRIC<NUMBER (or <=, >, >=), e.g. 'ter<-0.02'; got {text!r}")
    metric, op, number = match.groups()
    return metric, op, float(number)


class Contrast(TypedDict):
    """A metric in A and B, the difference B − A, and its two-sample percentile interval (`_contrast`)."""

    a: float | None
    b: float | None
    diff: float | None
    lo: float | None
    hi: float | None
    replicates_used: int  # replicates where both ratios are defined
    small_sample: bool  # either run's denominator is below the bootstrap's floor: no interval (lo, hi None)


class MetricDrift(Contrast):
    """A row of DiffResult.rows, after its cohort's values (the result's `keys`)."""

    metric: str
    tasks_a: int
    tasks_b: int


class ToolDrift(Contrast):
    """A row of DiffResult.tools (the invalid rate), after its cohort's values (benchmark, tool, the labels)."""

    calls_a: int
    calls_b: int


class ToolCalls(TypedDict):
    """A tool found in one run only, after its cohort's values."""

    calls: int


@dataclass(frozen=True)
class DiffResult:
    keys: list[str]  # the cohort columns (benchmark, then the labels)
    rows: list[MetricDrift]  # per cohort in both runs and metric
    only_a: list[Labels]  # cohort keys found only in A
    only_b: list[Labels]  # and only in B
    tools: list[ToolDrift]  # per benchmark × tool in both: the invalid rate
    new_tools: list[ToolCalls]  # in B, not in A
    vanished_tools: list[ToolCalls]  # in A, not in B
    new_causes: list[CauseCount]  # a cause of invalid calls in B, not in A, after its cohort's values
    shared_tasks: int  # (benchmark, task) pairs both runs have: the samples are not independent then
    settings: BootstrapSettings
    seed_b: int
    population: Population = DEFAULT_POPULATION

    def json_rows(self) -> list[dict[str, object]]:
        """`pexec diff --json`: first how the intervals were drawn and what the runs share (kind `diff`), then a
        row per cohort × metric (`metric`) and per tool (`tool`), then what one run only has (`only_a`, `only_b`,
        `new_tool`, `vanished_tool`, `new_cause`). Never empty: runs with no cohort in common still say so."""
        s = self.settings
        drawn = {"B": s.B, "seed": s.seed, "seed_b": self.seed_b, "method": s.method, "level": s.level,
                 "unit": "task", "duckdb_version": duckdb.__version__}  # fmt: skip
        p = self.population
        head = {"kind": "diff", "keys": self.keys, "bootstrap": drawn, "shared_tasks": self.shared_tasks,
                "cohorts_compared": len({key_values(r, self.keys) for r in self.rows}),
                "harness_errors": p.harness_errors, "strict_replay": p.strict_replay,
                "pools": {name: list(benchmarks) for name, benchmarks in p.pools}}  # fmt: skip
        out: list[dict[str, object]] = [head]
        out += [{"kind": "metric", **r} for r in self.rows]
        out += [{"kind": "tool", "metric": TOOL_METRIC, **r} for r in self.tools]
        listed: list[tuple[str, Sequence[Mapping[str, object]]]] = [
            ("only_a", self.only_a),
            ("only_b", self.only_b),
            ("new_tool", self.new_tools),
            ("vanished_tool", self.vanished_tools),
            ("new_cause", self.new_causes),
        ]
        out += [{"kind": kind, **r} for kind, rows in listed for r in rows]
        return out


def diff_runs(
    run_a: Run,
    run_b: Run,
    by: Sequence[str] | None = (),
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    population: Population = DEFAULT_POPULATION,
    address: str | None = None,
) -> DiffResult:
    """B − A per cohort and metric, and per tool, with two-sample task-level bootstrap intervals. `address`: each
    run's metrics and tool profiles computed in Ray tasks on the Ray there (the poisson-merged bootstrap only; the
    same numbers as here), no process reading every rollout or call."""
    settings_b = replace(settings, seed=settings.seed ^ SEED_B)
    names = [m.name for m in metric_catalogue.ratios()]
    a, reps_a = run_a.cohorts_and_replicates(by, settings, None, population, names, address)
    b, reps_b = run_b.cohorts_and_replicates(by, settings_b, None, population, names, address)
    fields = set(cohort_fields())
    keys = list(dict.fromkeys(k for c in [*a, *b] for k in c if k not in fields))
    index_a = {key_values(c, keys): i for i, c in enumerate(a)}
    index_b = {key_values(c, keys): i for i, c in enumerate(b)}
    rows: list[MetricDrift] = []
    for key, j in index_b.items():
        if key not in index_a:
            continue
        i = index_a[key]
        for name in names:
            contrast = _contrast(ratio(a[i], name), ratio(b[j], name), reps_a[i][name], reps_b[j][name], settings)
            drift: MetricDrift = {"metric": name, **contrast, "tasks_a": a[i]["n_tasks"], "tasks_b": b[j]["n_tasks"]}
            rows.append(labelled(dict(zip(keys, key, strict=True)), drift))
    labels = keys[1:]  # the tools' cohorts: benchmark × tool × the same labels
    tools_a, tool_reps_a = run_a.profiles_and_replicates(labels, settings, population, True, address)
    tools_b, tool_reps_b = run_b.profiles_and_replicates(labels, settings_b, population, True, address)
    tool_rows, new_tools, vanished, new_causes = _tool_changes(tools_a, tools_b, tool_reps_a, tool_reps_b, settings)
    return DiffResult(
        keys=keys,
        rows=rows,
        only_a=[dict(zip(keys, k, strict=True)) for k in index_a if k not in index_b],
        only_b=[dict(zip(keys, k, strict=True)) for k in index_b if k not in index_a],
        tools=tool_rows,
        new_tools=new_tools,
        vanished_tools=vanished,
        new_causes=new_causes,
        shared_tasks=shared_tasks(run_a.snapshot, run_b.snapshot, address),
        settings=settings,
        seed_b=settings_b.seed,
        population=population,
    )


def breaches(result: DiffResult, thresholds: Sequence[Threshold]) -> list[str]:
    """One line per (threshold, cohort or tool) whose point difference B − A crosses it. A threshold that no
    cohort (or tool) of both runs can evaluate is refused: an alert that cannot fire must not read as "no drift"."""
    lines = []
    for t in thresholds:
        rows: Sequence[Contrast]
        if t.metric == TOOL_METRIC:
            rows, keys = result.tools, ["benchmark", "tool", *result.keys[1:]]
        else:
            rows, keys = [r for r in result.rows if r["metric"] == t.metric], result.keys
        if all(r["diff"] is None for r in rows):
            raise DiffError(
                f"--fail-on {t} cannot be evaluated: no {'tool' if t.metric == TOOL_METRIC else 'cohort'} of both "
                f"runs has {t.metric} defined in both"
            )
        for r in rows:
            if t.breached(r["diff"]):
                values = zip(keys, key_values(r, keys), strict=True)
                where = ", ".join(f"{k}={label_text(v)}" for k, v in values)
                lines.append(
                    f"breach {t}: {t.metric} B − A = {r['diff']:+.4f} [{_num(r['lo'])}, {_num(r['hi'])}] ({where})"
                )
    return lines


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:+.4f}"


def _contrast(
    a: Interval, b: Interval, reps_a: np.ndarray, reps_b: np.ndarray, settings: BootstrapSettings
) -> Contrast:
    """a, b, diff = b − a, and the percentile interval of the replicate differences B_b − A_b (a replicate where
    either ratio is undefined, NaN, is left out; `replicates_used` says how many remain). No interval where either
    run's denominator is below the floor of the task bootstrap (pipeline.core.intervals): with a handful of tasks
    its percentiles say nothing, down to a zero-width interval from one task against one."""
    if len(reps_a) != len(reps_b):
        raise ValueError(f"replicates of different bootstraps: {len(reps_a)} and {len(reps_b)}")
    value_a, value_b = a["value"], b["value"]
    both = ~(np.isnan(reps_a) | np.isnan(reps_b))
    diff = None if value_a is None or value_b is None else value_b - value_a
    small = a.get("small_sample", False) or b.get("small_sample", False)
    lo = hi = None
    if diff is not None and both.any() and not small:
        d = reps_b[both] - reps_a[both]
        # numpy's "linear" percentile: the rule metrics_intervals.sql uses (DuckDB's quantile_cont).
        lo, hi = (float(v) for v in np.quantile(d, settings.quantiles))
    used = int(both.sum())
    return {
        "a": value_a,
        "b": value_b,
        "diff": diff,
        "lo": lo,
        "hi": hi,
        "replicates_used": used,
        "small_sample": small,
    }


def _tool_changes(
    tools_a: list[ToolProfile],
    tools_b: list[ToolProfile],
    reps_a: list[np.ndarray],
    reps_b: list[np.ndarray],
    settings: BootstrapSettings,
) -> tuple[list[ToolDrift], list[ToolCalls], list[ToolCalls], list[CauseCount]]:
    first: Mapping[str, object] = tools_a[0] if tools_a else tools_b[0] if tools_b else {}
    keys = [k for k in first if k not in TOOL_FIELDS]
    index_a = {key_values(t, keys): i for i, t in enumerate(tools_a)}
    index_b = {key_values(t, keys): j for j, t in enumerate(tools_b)}
    rows: list[ToolDrift] = []
    new: list[ToolCalls] = []
    causes: list[CauseCount] = []
    for key, j in index_b.items():
        where = dict(zip(keys, key, strict=True))
        if key not in index_a:
            new.append(labelled(where, ToolCalls(calls=tools_b[j]["n_calls"])))
            continue
        i = index_a[key]
        ta, tb = tools_a[i], tools_b[j]
        contrast = _contrast(ta[TOOL_METRIC], tb[TOOL_METRIC], reps_a[i], reps_b[j], settings)
        rows.append(labelled(where, ToolDrift(**contrast, calls_a=ta["n_calls"], calls_b=tb["n_calls"])))
    seen_a: dict[Key, set[str]] = {}
    for t in tools_a:
        seen_a.setdefault(key_values(t, keys), set()).update(c["cause"] for c in t["causes"])
    for t in tools_b:
        for c in t["causes"]:
            if c["cause"] not in seen_a.get(key_values(t, keys), set()):
                causes.append(labelled(dict(zip(keys, key_values(t, keys), strict=True)), c))
    vanished = [
        labelled(dict(zip(keys, k, strict=True)), ToolCalls(calls=tools_a[i]["n_calls"]))
        for k, i in index_a.items()
        if k not in index_b
    ]
    return rows, new, vanished, causes
