"""`pexec diff` between two runs of the same rollouts: the step-level verdict diff (pipeline.metrics.verdicts),
printed or as JSON, and its --fail-on thresholds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from pipeline.apps.cli._render import fit_output, json_lines, out, print_table
from pipeline.core.intervals import MIN_TASKS
from pipeline.metrics.run import Run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.metrics.verdicts import KINDS, PairedDiff, paired_breaches, paired_diff, parse_paired_threshold

_TITLES = {
    "valid_to_invalid": "valid → invalid",
    "invalid_to_valid": "invalid → valid",
    "check_changed": "failed check changed",
    "cause_changed": "cause changed",
}


def paired(
    run_a: Run, run_b: Run, settings: BootstrapSettings, fail_on: list[str], as_json: bool, shared: tuple[int, int, int]
) -> list[str]:
    """Compare the runs step by step; returns the --fail-on breaches (checked before anything is computed)."""
    thresholds = [parse_paired_threshold(t) for t in fail_on]
    result = paired_diff(run_a, run_b, settings)
    if as_json:
        json_lines([result.to_json()])
    else:
        print_paired(result, shared)
    return paired_breaches(result, thresholds)


def print_paired(result: PairedDiff, shared: tuple[int, int, int]) -> None:
    fit_output()
    c, s = result.counts, result.settings
    n_a, n_b, n_shared = shared
    out.print(
        f"Paired step-level diff: the runs share {n_shared} rollout id(s) (A has {n_a}, B has {n_b}); "
        f"{c['compared']} compared over {c['tasks']} task(s)"
        + (f", {c['harness_errors']} left out as harness errors" if c["harness_errors"] else "")
        + f". Steps compared: {result.steps('same') + result.flips}"
        + (f"; {result.steps('unmatched')} step(s) in one run only" if "unmatched" in result.kinds else "")
        + ".",
    )
    table = Table(title="Verdict flips: A → B")
    for name in ("flip", "steps", "rollouts", "tasks"):
        table.add_column(name, justify="left" if name == "flip" else "right")
    for kind in KINDS:
        k = result.kinds.get(kind, {"steps": 0, "rollouts": 0, "tasks": 0})
        table.add_row(_TITLES[kind], str(k["steps"]), str(k["rollouts"]), str(k["tasks"]))
    print_table(table)
    table = Table(title="Paired changes B − A over the shared rollouts")
    for name in ("measure", "A", "B", "B − A", "95% interval"):
        table.add_column(name, justify="left" if name == "measure" else "right")
    for name, label in (("flip_rate", "flip rate"), ("ter", "TER"), ("auc_pec", "AUC-PEC"), ("fed", "mean FED")):
        v = result.changes[name]
        table.add_row(label, _fmt(v["a"]), _fmt(v["b"]), _fmt(v["value"], "" if name == "flip_rate" else "+"),
                      f"{_fmt(v['lo'])} – {_fmt(v['hi'])}")  # fmt: skip
    print_table(table)
    out.print(
        f"Flip rate = flipped steps / steps compared. 95% intervals: task-level bootstrap ({s.method}, B={s.B}, "
        f"seed {s.seed}) over the {c['tasks']} shared task(s), the same draws for every row; none below "
        f"{MIN_TASKS} tasks. "
        f"{c['fed_changed']} rollout(s) changed FED; {c['became_not_executable']} became not executable, "
        f"{c['became_executable']} became executable.",
    )
    for title, rows, keys in (
        ("Flips by tool", result.by_tool, ["kind", "tool"]),
        ("Flips by cause (A → B)", result.by_cause, ["kind", "cause_a", "cause_b"]),
        ("Flips by failed check (A → B)", result.by_check, ["kind", "check_a", "check_b"]),
    ):
        if rows:
            print_table(_grouped(title, rows, keys))
    for e in result.examples:
        out.print(
            f"{_TITLES[e['kind']]}: {e['rollout_id']} (task {e['task_id']}, from step {e['first_step']}, "
            f"{e['steps']} step(s))",
            markup=False,
            highlight=False,
        )
        for side, link in (("A", e["link_a"]), ("B", e["link_b"])):  # a link on a line of its own, copied whole
            out.print(f"  {side} {link}", soft_wrap=True, markup=False, highlight=False)
    if result.examples:
        out.print("Links open in `pexec view RUN_A` / `pexec view RUN_B` at their default address.")


def _grouped(title: str, rows: Sequence[Mapping[str, Any]], keys: list[str]) -> Table:
    table = Table(title=title)
    for k in [*keys, "steps"]:
        table.add_column(k, justify="right" if k == "steps" else "left")
    for r in rows:
        cells = [_TITLES.get(r[k], r[k]) if k == "kind" else ("–" if r[k] is None else str(r[k])) for k in keys]
        table.add_row(*cells, str(r["steps"]))
    return table


def _fmt(x: float | None, sign: str = "") -> str:
    return "–" if x is None else f"{x:{sign}.4f}"
