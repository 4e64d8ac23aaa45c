"""The report as display tables (cells already formatted as text): one layout rendered by both _markdown.py
and _html.py, so the two always show the same numbers. Fixed formats: ratios with 3 decimals, shares in % with
1 decimal, costs with 2 decimals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.core import intervals, metric_catalogue
from pipeline.core.model import CAUSES
from pipeline.core.text import label_text
from pipeline.metrics.results import Cohort, Interval, ToolProfile, key_values, ratio
from pipeline.metrics.settings import effects_note, harness_note, replay_note
from pipeline.report._ranking import Ranking
from pipeline.report._tables import Recovery, RunTables, SensitivityCount
from pipeline.report.paired import Compare, PairedRow

DASH = "–"
# The sensitivity table's metrics (`report --sensitivity`): TER and AUC-PEC under S, S+D and all checks.
SENSITIVITY_METRICS = ("ter_s", "ter_sd", "ter", "auc_pec_s", "auc_pec_sd", "auc_pec")


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def num(x: float | None, digits: int = 3) -> str:
    return DASH if x is None else f"{x:.{digits}f}"


def ci(m: Interval, digits: int = 3) -> str:
    return bounds(m["value"], m["lo"], m["hi"], digits, m.get("method"))


def bounds(value: float | None, lo: float | None, hi: float | None, digits: int = 3, method: str | None = None) -> str:
    """`value [lo, hi]`, marked when the interval is Wilson's (pipeline.core.intervals); a dash without a value."""
    if value is None:
        return DASH
    mark = f" {intervals.MARK}" if method == intervals.WILSON else ""
    return f"{num(value, digits)} [{num(lo, digits)}, {num(hi, digits)}]{mark}"


def share(x: float | None) -> str:
    return DASH if x is None else f"{100 * x:.0f}%"


def pct(numerator: int, denominator: int) -> str:
    return DASH if denominator == 0 else f"{100 * numerator / denominator:.1f}% ({numerator}/{denominator})"


def cost_name(column: str) -> str:
    return column.removeprefix("cost_")


def metrics_table(t: RunTables, ks: Sequence[int]) -> Table:
    costs = sorted({r["cost"] for r in t.costs})
    cost_of = {(key_values(r, t.keys), r["cost"]): r["mean"] for r in t.costs}
    shown = [m for m in metric_catalogue.METRICS if m.in_tables]
    columns = [*t.keys, "N", "tasks", "no verdict", "harness errors"]
    for m in shown:
        if m.kind == "curve":
            columns += [f"{m.label}@{k}" for k in ks]
        else:
            columns += [m.label, *([f"{m.label} n"] if m.eligible else [])]
    columns += [f"mean {cost_name(c)}" for c in costs]
    rows = []
    for c in t.cohorts:
        cells = [*(label_text(v) for v in key_values(c, t.keys)), str(c["n"]), str(c["n_tasks"])]
        cells += [str(c["n_unknown_success"]), str(c["n_harness_error"])]
        for m in shown:
            if m.kind == "curve":  # PEC, the catalogue's one curve
                curve = {p["k"]: p for p in c["pec"]}
                cells += [ci(curve[k]) if k in curve else DASH for k in ks]
            else:
                value = ratio(c, m.name)
                cells += [ci(value), *([str(value["eligible"])] if m.eligible else [])]
        cells += [num(cost_of.get((key_values(c, t.keys), col)), 2) for col in costs]
        rows.append(cells)
    counts = "".join(f"; {m.label} n = {m.eligible}" for m in shown if m.eligible)
    notes = [
        f"Values with 95% intervals (task-level bootstrap; {intervals.MARK}: see below){counts}. Success and RR "
        "are over the rollouts with a verdict (no verdict = success unknown, left out); TER, AUC-PEC and PEC over "
        "all N. AUC-PEC (writes) is over the rollouts with a write or irreversible call (its n; the others have "
        "no writes); invalid irreversible and weighted AUC-PEC over all N.",
        harness_note(t.cohorts),
    ]
    if any(_small(c) for c in t.cohorts):
        notes.append(intervals.NOTE)
    if any(c["n_no_calls"] for c in t.cohorts):
        no_calls = ", ".join(f"{'/'.join(map(str, key_values(c, t.keys)))}: {c['n_no_calls']}" for c in t.cohorts)
        notes.append(f"Rollouts with no calls (vacuously executable): {no_calls}.")
    effects = effects_note(t.cohorts)
    if effects:
        notes.append(effects)
    notes.append(replay_note(t.cohorts))
    return Table("Metrics per benchmark × condition", columns, rows, notes)


def _small(cohort: Cohort) -> bool:
    points: list[Interval] = [ratio(cohort, m.name) for m in metric_catalogue.ratios()]
    return any(p.get("method") == intervals.WILSON for p in [*points, *cohort["pec"]])


def recovery_table(t: RunTables) -> Table:
    columns = [*t.keys, "N", "no verdict", "with a verdict", "executable", "executable & successful"]
    columns += ["invalid prefix (RR n)", "invalid prefix & successful", "successes"]
    columns += ["successes after an invalid prefix", "success = TER_v · P(success | executable) + (1 − TER_v) · RR"]
    rows = [
        [
            *(label_text(v) for v in key_values(r, t.keys)),
            str(r["n"]),
            str(r["n_unknown_success"]),
            str(r["n_with_verdict"]),
            str(r["n_executable_with_verdict"]),
            str(r["n_executable_success"]),
            str(r["n_invalid_prefix_with_verdict"]),
            str(r["n_invalid_prefix_success"]),
            str(r["n_success"]),
            pct(r["n_invalid_prefix_success"], r["n_success"]),
            identity(r),
        ]
        for r in t.recovery
    ]
    note = (
        "Over the rollouts with a verdict (N − no verdict): with a verdict = executable + invalid prefix, "
        "successes = executable & successful + invalid prefix & successful; TER_v = executable / with a verdict "
        "(the metrics table's TER is over all N), P(success | executable) = executable & successful / executable, "
        "RR = invalid prefix & successful / invalid prefix, exactly the metrics table's RR and RR n."
    )
    return Table("Recovery arithmetic", columns, rows, [note])


def users_table(t: RunTables) -> Table:
    """The user simulator's own calls (dual control), beside the agent's headline: a harness diagnostic."""
    columns = [*t.keys, "rollouts with user calls", "user calls", "invalid user calls", "all user calls valid"]
    rows = [
        [
            *(label_text(v) for v in key_values(r, t.keys)),
            str(r["n_with_user_calls"]),
            str(r["n_user_calls"]),
            str(r["n_user_invalid"]),
            f"{r['n_user_executable']} ({pct(r['n_user_executable'], r['n_with_user_calls'])})",
        ]
        for r in t.users
    ]
    note = (
        "The user simulator's calls on its own tools (τ telecom's phone), replayed in logged order on the shared "
        "state and scored like the agent's. Every other table is over the agent's calls; a user simulator that "
        "makes invalid calls is a harness problem."
    )
    return Table("User simulator calls (diagnostic)", columns, rows, [note])


def identity(r: Recovery) -> str:
    """success = TER_v · P(success | executable) + (1 − TER_v) · RR in the row's own counts, as fractions: exact
    because with a verdict = executable + invalid prefix and successes = the two successful counts (the parts)."""
    known, ex, ex_s = r["n_with_verdict"], r["n_executable_with_verdict"], r["n_executable_success"]
    inv, inv_s = r["n_invalid_prefix_with_verdict"], r["n_invalid_prefix_success"]
    if known == 0:
        return DASH
    terms = []
    if ex:
        terms.append(f"{ex}/{known} · {ex_s}/{ex}")
    if inv:
        terms.append(f"{inv}/{known} · {inv_s}/{inv}")
    return f"{r['n_success']}/{known} = " + " + ".join(terms)


def causes_table(t: RunTables) -> Table:
    present = {r["cause"] for r in t.causes}
    causes = [c for c in CAUSES if c in present] + sorted(present - set(CAUSES))
    count = {(key_values(r, t.keys), r["cause"]): r["n"] for r in t.causes}
    rows = []
    for r in t.recovery:
        key = key_values(r, t.keys)
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
        flips = [
            f"{_label(f.metric)}: {f.higher_metric} above {f.higher_success} (holds in {share(f.share)} of replicates)"
            for f in r.flips
        ]
        notes.append("Order flips vs success: " + ("; ".join(flips) if flips else "none"))
        if flips:
            notes.append(
                "A flip's share is over the bootstrap replicates of the intervals: near 100% a real reversal, "
                "near 50% or below noise."
            )
        title = " · ".join(str(v) if k == "benchmark" else f"{k}={v}" for k, v in r.group.items())
        out.append(Table(f"Ranking divergence — {title}", columns, rows, notes))
    return out


def paired_table(compare: Compare, pair_cols: list[str], rows_in: list[PairedRow]) -> Table:
    columns = [
        *pair_cols,
        "shared tasks",
        "metric",
        "tasks",
        "units",
        compare.a,
        compare.b,
        "difference A − B [95% CI]",
    ]
    rows = []
    for r in rows_in:
        is_cost = r["kind"] == "pct"
        label = f"mean {cost_name(r['metric'])} (change %)" if is_cost else _label(r["metric"])
        digits = 2 if is_cost else 3
        if r["small_sample"] and r["value"] is not None:
            shown = f"{num(r['value'], 1 if is_cost else 3)} [{DASH}]"
        else:
            shown = bounds(r["value"], r["lo"], r["hi"], 1 if is_cost else 3)
        value = shown + " %" if is_cost and r["value"] is not None else shown
        keys = [DASH if v is None else v for v in key_values(r, pair_cols)]
        counts = [str(r["shared_tasks"]), label, str(r["den_tasks"]), str(r["den_total"])]
        rows.append([*keys, *counts, num(r["value_a"], digits), num(r["value_b"], digits), value])
    note = (
        f"A = {compare.column}={compare.a}, B = {compare.column}={compare.b}, over the tasks both share; paired "
        "task-level bootstrap (the same task draws for A and B). Costs: change of the mean in % of B. Tasks and "
        "units: what each difference rests on, the smaller side's shared tasks with a nonzero denominator and its "
        f"total (rollouts, or rollouts with the cost); [{DASH}]: no interval below {intervals.MIN_TASKS} tasks or "
        f"{intervals.MIN_DENOMINATOR} units, where the task bootstrap says nothing."
    )
    if not rows:
        note = (
            f"The pairing is empty: {compare.column}={compare.a} and {compare.column}={compare.b} share no task in "
            "any cohort, so there is nothing to compare pairwise. For two samples of different tasks use an "
            "unpaired comparison (`pexec diff RUN_A RUN_B`)."
        )
    return Table(f"Paired comparison — {compare.title}", columns, rows, [note])


def settings_line(cohorts: list[Cohort]) -> str:
    if not cohorts:
        return "No rollouts."
    b = cohorts[0]["bootstrap"]
    return (
        f"95% intervals: {b['method']} task-level bootstrap, B={b['B']}, seed={b['seed']}, "
        f"level={b['level']}, DuckDB {b['duckdb_version']}; {intervals.MARK} marks a Wilson interval on the effective "
        "sample size instead (small sample or estimate at 0 or 1)."
        + (
            " --strict-replay: rollouts whose replay diverged before their first error are left out."
            if cohorts[0]["strict_replay"]
            else ""
        )
    )


def _label(metric: str) -> str:
    """A metric's display name; `pec@3` -> PEC@3."""
    name, at, k = metric.partition("@")
    return metric_catalogue.metric(name).label + at + k


def _rank(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.1f}"


def tools_table(rows: list[ToolProfile], keys: Sequence[str]) -> Table:
    """The per-tool error profile (pipeline.metrics.tool_profiles): one row per benchmark × tool [× labels]."""
    columns = [*keys, "calls", "tasks", "invalid rate", "invalid", "causes", "first errors", "first-error share",
               "output match", "output match n"]  # fmt: skip
    out = []
    for r in rows:
        causes = ", ".join(f"{c['cause']} ({c['n']})" for c in r["causes"]) or DASH
        cells = [DASH if v is None else v for v in key_values(r, keys)]
        cells += [str(r["n_calls"]), str(r["n_tasks"]), ci(r["invalid_rate"]), str(r["n_invalid"]), causes]
        cells += [str(r["n_first_errors"]), share(r["first_error_share"]), ci(r["output_match"])]
        cells.append(str(r["output_match"]["eligible"]))
        out.append(cells)
    notes = [
        f"Per tool, over its calls in the counted rollouts. Invalid rate and output match: value [95% interval], "
        f"task-level bootstrap (clustered by task: a task's calls are resampled together; {intervals.MARK}: "
        "Wilson on the effective sample size). First errors: calls that were their rollout's first invalid call; "
        "first-error share: of the first errors in the benchmark (× labels), the share at this tool (no interval). "
        "Output match only where a simulator replayed the call and the log had an output (n).",
    ]
    return Table("Per-tool error profile", columns, out, notes)


def sensitivity_table(t: RunTables, approx: list[SensitivityCount]) -> Table:
    """TER and AUC-PEC when only S, S and D, or all checks make a call invalid (one scoring pass, `--sensitivity`)."""
    by_key = {key_values(r, t.keys): r for r in approx}
    columns = [*t.keys, "N", "TER (S)", "TER (S+D)", "TER (all)", "AUC-PEC (S)", "AUC-PEC (S+D)", "AUC-PEC (all)",
               "approx. S", "approx. S+D"]  # fmt: skip
    rows = []
    for c in t.cohorts:
        r = by_key.get(key_values(c, t.keys))
        cells = [*(label_text(v) for v in key_values(c, t.keys)), str(c["n"])]
        cells += [ci(ratio(c, m)) for m in SENSITIVITY_METRICS]
        cells += [str(0 if r is None else r[n]) for n in ("n_approx_schema", "n_approx_schema_dependency")]
        rows.append(cells)
    notes = [
        "From one scoring pass with every check on: a call counts as invalid under S when its first failed check is "
        "schema, under S+D when it is schema or dependency. Values with 95% intervals (task-level bootstrap). The "
        "numbers are exact up to each rollout's first error; after a call rejected by a check that a looser level "
        "ignores, the later calls were judged without that call having run. `approx.` counts the rollouts where "
        "that happened before their last call: their looser-level depth could change under a rescoring with the "
        "check off (`pexec score --policy`/spec changes), which pexec does not do here.",
    ]
    return Table("Sensitivity to the checks: TER and AUC-PEC under S, S+D and all checks", columns, rows, notes)
