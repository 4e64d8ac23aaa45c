"""`build_report`: compute a scored run's tables (DuckDB and the metrics stage), rank (_ranking.py), draw
(_figures.py) and write them (_markdown.py, _html.py) under the report folder; `check_request` and `check_output`
refuse, before any work, a request or an output folder that cannot be written."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.core import metric_catalogue
from pipeline.core.arrow import pa
from pipeline.core.errors import EmptyRun, ReportError, StorageError
from pipeline.core.text import public_url
from pipeline.metrics.cohorts import metrics_tables
from pipeline.metrics.completeness import Coverage
from pipeline.metrics.duck import fetch, run_sql, set_variables
from pipeline.metrics.results import Interval, ToolProfile, key_values, ratio
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, DEFAULT_POPULATION, BootstrapSettings, Population
from pipeline.report import _html as html
from pipeline.report import _markdown as markdown
from pipeline.report import layout
from pipeline.report._figures import (
    Chart,
    cause_chart,
    cause_rows,
    cohort_colours,
    fed_chart,
    fed_rows,
    pec_chart,
    pec_rows,
    tool_chart,
    tool_rows,
)
from pipeline.report._ranking import Ranking, rank_conditions
from pipeline.report._tables import RunTables, SensitivityCount, run_tables
from pipeline.report.paired import Compare, PairedRow, check_paired_method, paired_comparison
from pipeline.storage.fs import filesystem, is_empty, open_for_write, remove_all

DEFAULT_KS = (1, 3, 5)


@dataclass(frozen=True)
class ReportResult:
    out: str  # the report folder, as given (local path or URL)
    files: list[str]  # every file written, sorted
    tables: RunTables
    rankings: list[Ranking]
    paired: list[PairedRow]  # one row per pair and metric; empty without --compare
    charts: list[Chart]
    tools: list[ToolProfile]  # the per-tool error profile (pipeline.metrics.tool_profiles): benchmark × tool × labels


NO_FIGURES = "Figures not drawn (asked for the tables alone: --no-figures)."


def build_report(
    run: Run,
    out: str | Path,
    by: Sequence[str] | None = None,
    compare: Compare | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    *,
    overwrite: bool = False,
    within: str | None = None,
    population: Population = DEFAULT_POPULATION,
    sensitivity: bool = False,
    figures: bool = True,
    allow_empty: bool = False,
    address: str | None = None,
) -> ReportResult:
    """Write the report of `run` into `out` (a local folder or an fsspec URL, written with the run's storage
    options). Every table reads the files of the run's one snapshot; a partial run's report says so at the top.
    A non-empty `out` is refused unless `overwrite`, which removes what it holds first.
    `within`: rank the other conditions within each value of this cohort column (default: per benchmark).
    `population`: which rollouts count (harness errors, pools, strict replay: pipeline.metrics.settings).
    `sensitivity`: add the table of TER and AUC-PEC under schema-only, schema+dependency and all checks.
    `figures`: False writes the tables and text alone (drawing the figures is most of a small report's time); the
    report says so at the top. A run that holds no rollout is EmptyRun, nothing written, unless `allow_empty`.
    `address`: the metrics and tool profiles computed in Ray tasks on the Ray there (the poisson-merged bootstrap;
    the same numbers), no process reading every rollout or call."""
    root = str(out).rstrip("/")
    storage_options = run.storage_options
    check_request(run.url, root, ks, overwrite, storage_options)
    if compare is not None:  # before any metric is computed (on Ray, minutes)
        check_paired_method(settings)
    ks = sorted(set(ks))
    t = run_tables(run, by, ks, settings, population, address)
    if not t.cohorts and not allow_empty:
        rejected = run.rejected()
        raise EmptyRun(public_url(run.url), rejected, rejected)
    conditions = t.keys[1:]
    if within is not None and within not in conditions:
        available = ", ".join(conditions) or "none"
        raise ReportError(f"--within takes one of the cohort's label columns ({available}), got {within!r}")

    def label(row: Mapping[str, object]) -> str:
        return " · ".join("–" if v is None else v for v in key_values(row, conditions)) or "all"

    rankings = _rankings(t, within)
    pair_cols: list[str] = []
    paired: list[PairedRow] = []
    if compare is not None:
        pair_cols, paired = paired_comparison(run, compare, t.keys, ks, settings, population)
    tools = run.tool_profiles(conditions, settings, population, address)
    colours = cohort_colours(label(c) for c in t.cohorts)  # one colour per cohort in every figure
    charts = (
        [
            pec_chart(pec_rows(t.cohorts, label), colours),
            fed_chart(fed_rows(t.fed, label), colours),
            cause_chart(cause_rows(t.causes, label)),
            *([tool_chart(tool_rows(tools, label))] if tools else []),
        ]
        if figures
        else []
    )
    n_keys = len(t.keys)
    display = [layout.metrics_table(t, ks), layout.recovery_table(t), layout.causes_table(t)]
    key_counts = [n_keys, n_keys, n_keys]
    if t.users:
        display.append(layout.users_table(t))
        key_counts.append(n_keys)
    if tools:
        display.append(layout.tools_table(tools, [t.keys[0], "tool", *conditions]))
        key_counts.append(n_keys + 1)
    ranked = layout.ranking_tables(rankings)
    display += ranked
    key_counts += [1] * len(ranked)  # the condition column
    if compare is not None:
        display.append(layout.paired_table(compare, pair_cols, paired))
        key_counts.append(len(pair_cols))
    approx: list[SensitivityCount] = []
    if sensitivity:
        approx = sensitivity_counts(run, t.keys, population)
        display.append(layout.sensitivity_table(t, approx))
        key_counts.append(n_keys)
    title = f"Prefix executability report — {run.url}"
    covered = t.cohorts[0]["partial"] if t.cohorts else None
    preamble = [
        *([f"⚠ {Coverage.from_json(covered).describe()}"] if covered else []),
        *(f"⚠ {note}" for note in run.written_by(population)),
        layout.settings_line(t.cohorts),
        *([] if figures else [NO_FIGURES]),
    ]
    if overwrite:
        remove_all(root, storage_options)

    def write(name: str, data: bytes) -> str:
        try:
            with open_for_write(f"{root}/{name}", storage_options) as f:
                f.write(data)
        except OSError as exc:
            raise StorageError(f"cannot write {root}/{name}: {exc}") from exc
        return f"{root}/{name}"

    written = [
        write("report.md", markdown.render(title, preamble, display, charts).encode()),
        write("report.html", html.render(title, preamble, display, charts, key_counts).encode()),
    ]
    metrics, pec = metrics_tables(t.cohorts)
    data = {
        "metrics": metrics,
        "pec": pec,
        "recovery": _table(t.recovery),
        "causes": _table(t.causes),
        "fed": _table(t.fed),
        "tools": _table([_tool_row(r) for r in tools]),
        "costs": _table(t.costs),
        "users": _table(t.users),
        "ranking": _table(_ranking_rows(rankings)),
        "paired": _table([{**r, "compare": compare.title} for r in paired] if compare else []),
        "sensitivity": _table(_sensitivity_rows(t, approx) if sensitivity else []),
    }
    for name, table in data.items():
        if table.num_rows:
            written.append(write(f"tables/{name}.parquet", _parquet(table)))
            written.append(write(f"tables/{name}.csv", _csv(table)))
    for c in charts:
        written.append(write(f"figures/{c.name}.png", c.png))
        written.append(write(f"figures/{c.name}.svg", c.svg.encode()))
        written.append(write(f"figures/{c.name}.pdf", c.pdf))
        rows = [dict(zip(c.columns, r, strict=True)) for r in c.rows]
        written.append(write(f"figures/{c.name}.csv", _csv(pa.Table.from_pylist(rows))))
    return ReportResult(root, sorted(written), t, rankings, paired, charts, tools)


def check_request(
    run: str, out: str, ks: Sequence[int], overwrite: bool, storage_options: dict[str, Any] | None
) -> None:
    """What a report needs that the run itself does not say: depths k >= 1 and a report folder it may write."""
    if not ks or any(k < 1 for k in ks):
        raise ReportError(f"--k takes depths >= 1, got {list(ks)}")
    check_output(run, out, overwrite, storage_options)


def check_output(run: str, out: str, overwrite: bool, storage_options: dict[str, Any] | None) -> None:
    """Refuse a report folder that holds files unless `overwrite`, and never remove the run itself."""
    run_fs, run_path = filesystem(run, storage_options)
    out_fs, out_path = filesystem(out, storage_options)
    if (
        overwrite
        and type(run_fs) is type(out_fs)
        and (run_path.rstrip("/") + "/").startswith(out_path.rstrip("/") + "/")
    ):
        raise ReportError(f"--overwrite would remove {out}, which holds the run {run}: choose another --out")
    if not overwrite and not is_empty(out, storage_options):
        raise ReportError(f"report folder {out} is not empty: pass --overwrite to replace what it holds")


def _rankings(t: RunTables, within: str | None) -> list[Ranking]:
    """One ranking per benchmark (and value of `within`) with at least two conditions (a single one has no
    order); the conditions are named by the other labels."""
    group_cols = ["benchmark", *([within] if within else [])]
    shown = [k for k in t.keys[1:] if k != within]
    groups: dict[tuple[str | None, ...], list[int]] = {}
    for i, c in enumerate(t.cohorts):
        groups.setdefault(key_values(c, group_cols), []).append(i)
    ranked = ["success", *(m.name for m in metric_catalogue.ratios() if m.ranked)]
    out = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        cohorts = [t.cohorts[i] for i in members]
        labels = [" · ".join("–" if v is None else v for v in key_values(c, shown)) or "all" for c in cohorts]
        values = {m: [ratio(c, m)["value"] for c in cohorts] for m in ranked}
        replicates = {m: [t.replicates[i][m] for i in members] for m in ranked}
        out.append(rank_conditions(dict(zip(group_cols, key, strict=True)), labels, values, replicates))
    return out


def _ranking_rows(rankings: list[Ranking]) -> list[dict[str, object]]:
    """The rankings as the rows of tables/ranking.*: the group's values, the condition, then per metric its value
    and rank, τ-b against success and the flips the condition is part of."""
    rows = []
    for r in rankings:
        for i, condition in enumerate(r.conditions):
            row: dict[str, object] = {**r.group, "condition": condition}
            for m in r.values:
                row |= {m: r.values[m][i], f"rank_{m}": r.ranks[m][i]}
            row |= {f"kendall_tau_b_success_{m}": tau for m, tau in r.tau.items()}
            row["flips"] = "; ".join(
                f"{f.metric}: {f.higher_metric} > {f.higher_success} ({layout.share(f.share)} of replicates)"
                for f in r.flips
                if condition in (f.higher_metric, f.higher_success)
            )
            rows.append(row)
    return rows


def sensitivity_counts(run: Run, keys: list[str], population: Population) -> list[SensitivityCount]:
    """Per cohort, the rollouts whose looser-level depths a rescoring could change (sql/report_sensitivity.sql)."""
    with run.connect(population) as con:
        set_variables(con, cohort_cols=keys)
        run_sql(con, "report/report_sensitivity")
        return fetch(con, "report_sensitivity", SensitivityCount)


def _sensitivity_rows(t: RunTables, approx: list[SensitivityCount]) -> list[dict[str, object]]:
    """The sensitivity table as the rows of tables/sensitivity.*: the cohort, N, each metric's value and bounds,
    and the rollouts whose looser-level depth is approximate."""
    by_key = {key_values(r, t.keys): r for r in approx}
    rows = []
    for c in t.cohorts:
        cohort: Mapping[str, object] = c
        row: dict[str, object] = {k: cohort.get(k) for k in t.keys} | {"n": c["n"]}
        for m in layout.SENSITIVITY_METRICS:
            value = ratio(c, m)
            row |= {m: value["value"], f"{m}_lo": value["lo"], f"{m}_hi": value["hi"]}
        counts = by_key.get(key_values(c, t.keys))
        row |= {k: 0 if counts is None else counts[k] for k in ("n_approx_schema", "n_approx_schema_dependency")}
        rows.append(row)
    return rows


def _tool_row(r: ToolProfile) -> dict[str, object]:
    """A per-tool profile flattened for CSV / Parquet (intervals as _lo/_hi/_method columns, causes as text)."""
    entries: Mapping[str, object] = r
    flat = {k: v for k, v in entries.items() if k != "partial" and not isinstance(v, dict | list)}
    flat["causes"] = "; ".join(f"{c['cause']}={c['n']}" for c in r["causes"])
    metrics: dict[str, Interval] = {"invalid_rate": r["invalid_rate"], "output_match": r["output_match"]}
    for m, value in metrics.items():
        flat |= {m: value["value"], f"{m}_lo": value["lo"], f"{m}_hi": value["hi"], f"{m}_method": value.get("method")}
        flat[f"{m}_eligible"] = value["eligible"]
    return flat


def _table(rows: Sequence[Mapping[str, object]]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def _parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _csv(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer)
    return buffer.getvalue()
