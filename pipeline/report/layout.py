"""The report as display tables (cells already formatted as text): one layout rendered by both markdown.py
and html.py, so the two always show the same numbers. Fixed formats: ratios with 3 decimals, shares in % with
1 decimal, costs with 2 decimals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline import catalogue
from pipeline.aggregate import harness_note
from pipeline.model import CAUSES
from pipeline.report.paired import Compare
from pipeline.report.ranking import Ranking
from pipeline.report.tables import RunTables, key_of

DASH = "–"


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def num(x: float | None, digits: int = 3) -> str:
    return DASH if x is None else f"{x:.{digits}f}"


def ci(m: dict[str, Any], digits: int = 3) -> str:
    if m.get("value") is None:
        return DASH
    return f"{num(m['value'], digits)} [{num(m['lo'], digits)}, {num(m['hi'], digits)}]"


def pct(numerator: int, denominator: int) -> str:
    return DASH if denominator == 0 else f"{100 * numerator / denominator:.1f}% ({numerator}/{denominator})"


def cost_name(column: str) -> str:
    return column.removeprefix("cost_")


def metrics_table(t: RunTables, ks: Sequence[int]) -> Table:
    costs = sorted({r["cost"] for r in t.costs})
    cost_of = {(key_of(r, t.keys), r["cost"]): r["mean"] for r in t.costs}
    shown = [m for m in catalogue.METRICS if m.in_tables]
    columns = [*t.keys, "N", "tasks", "harness errors"]
    for m in shown:
        if m.kind == "curve":
            columns += [f"{m.label}@{k}" for k in ks]
        else:
            columns += [m.label, *([f"{m.label} n"] if m.eligible else [])]
    columns += [f"mean {cost_name(c)}" for c in costs]
    rows = []
    for c in t.cohorts:
        cells = [*(str(v) for v in key_of(c, t.keys)), str(c["n"]), str(c["n_tasks"]), str(c["n_harness_error"])]
        for m in shown:
            if m.kind == "curve":
                curve = {p["k"]: p for p in c[m.name]}
                cells += [ci(curve[k]) if k in curve else DASH for k in ks]
            else:
                cells += [ci(c[m.name]), *([str(c[m.name]["eligible"])] if m.eligible else [])]
        cells += [num(cost_of.get((key_of(c, t.keys), col)), 2) for col in costs]
        rows.append(cells)
    counts = "".join(f"; {m.label} n = {m.eligible}" for m in shown if m.eligible)
    notes = [f"Values with 95% task-level bootstrap intervals{counts}.", harness_note(t.cohorts)]
    if any(c["n_no_calls"] for c in t.cohorts):
        no_calls = ", ".join(f"{'/'.join(map(str, key_of(c, t.keys)))}: {c['n_no_calls']}" for c in t.cohorts)
        notes.append(f"Rollouts with no calls (vacuously executable): {no_calls}.")
    return Table("Metrics per benchmark × condition", columns, rows, notes)


def recovery_table(t: RunTables) -> Table:
    columns = [*t.keys, "N", "executable & successful", "invalid prefix & successful", "invalid prefix"]
    columns += ["successes", "successes after an invalid prefix", "unknown verdict"]
    rows = [
        [
            *(str(v) for v in key_of(r, t.keys)),
            str(r["n"]),
            str(r["n_executable_success"]),
            str(r["n_invalid_prefix_success"]),
            str(r["n_invalid_prefix"]),
            str(r["n_success"]),
            pct(r["n_invalid_prefix_success"], r["n_success"]),
            str(r["n_success_unknown"]),
        ]
        for r in t.recovery
    ]
    note = "success = executable & successful + invalid prefix & successful (RR = the second over invalid prefix)."
    return Table("Recovery arithmetic", columns, rows, [note])


def causes_table(t: RunTables) -> Table:
    present = {r["cause"] for r in t.causes}
    causes = [c for c in CAUSES if c in present] + sorted(present - set(CAUSES))
    count = {(key_of(r, t.keys), r["cause"]): r["n"] for r in t.causes}
    rows = []
    for r in t.recovery:
        key = key_of(r, t.keys)
        cells = [pct(count.get((key, c), 0), r["n_invalid_prefix"]) for c in causes]
        rows.append([*(str(v) for v in key), str(r["n_invalid_prefix"]), *cells])
    note = "Share of the rollouts with an invalid prefix, by the cause of their first invalid call (diagnostic)."
    return Table("First-error cause", [*t.keys, "invalid prefix", *causes], rows, [note])


def ranking_tables(rankings: list[Ranking]) -> list[Table]:
    out = []
    for r in rankings:
        columns = ["condition"]
        for m in r.values:
            columns += [_label(m), f"rank ({_label(m)})"]
        rows = []
        for i, condition in enumerate(r.conditions):
            cells = [condition]
            for m in r.values:
                cells += [num(r.values[m][i]), _rank(r.ranks[m][i])]
            rows.append(cells)
        notes = [f"Kendall τ-b (success vs {_label(m)}): {num(tau)}" for m, tau in r.tau.items()]
        flips = [f"{_label(f.metric)}: {f.higher_metric} above {f.higher_success}" for f in r.flips]
        notes.append("Order flips vs success: " + ("; ".join(flips) if flips else "none"))
        out.append(Table(f"Ranking divergence — {r.benchmark}", columns, rows, notes))
    return out


def paired_table(compare: Compare, pair_cols: list[str], rows_in: list[dict[str, Any]]) -> Table:
    columns = [*pair_cols, "shared tasks", "metric", compare.a, compare.b, "difference A − B [95% CI]"]
    rows = []
    for r in rows_in:
        is_cost = r["kind"] == "pct"
        label = f"mean {cost_name(r['metric'])} (change %)" if is_cost else _label(r["metric"])
        digits = 2 if is_cost else 3
        value = ci(r, 1) + " %" if is_cost and r["value"] is not None else ci(r, 3)
        keys = [DASH if r.get(k) is None else str(r[k]) for k in pair_cols]
        rows.append([*keys, str(r["shared_tasks"]), label, num(r["value_a"], digits), num(r["value_b"], digits), value])
    note = (
        f"A = {compare.column}={compare.a}, B = {compare.column}={compare.b}, over the tasks both share; paired "
        "task-level bootstrap (the same task draws for A and B). Costs: change of the mean in % of B."
    )
    return Table(f"Paired comparison — {compare.title}", columns, rows, [note])


def settings_line(cohorts: list[dict[str, Any]]) -> str:
    if not cohorts:
        return "No rollouts."
    b = cohorts[0]["bootstrap"]
    return (
        f"95% intervals: {b['method']} task-level bootstrap, B={b['B']}, seed={b['seed']}, "
        f"level={b['level']}, DuckDB {b['duckdb_version']}."
    )


def _label(metric: str) -> str:
    """A metric's display name; `pec@3` -> PEC@3."""
    name, at, k = metric.partition("@")
    return catalogue.metric(name).label + at + k


def _rank(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.1f}"
