"""`pexec diff RUN_A RUN_B` when both runs scored the same rollouts (another spec, other checks, another pexec or
simulator version): the verdicts compared step by step, paired by rollout id (sql/paired_steps.sql).

Reported: how many rollouts the runs share; the steps whose verdict flipped (valid -> invalid, invalid -> valid, the
failed check or the cause changed) with their counts by tool, cause and check; the flip rate (flipped steps / steps
compared) and the paired changes B − A of TER, AUC-PEC and mean FED over the shared rollouts, each with a 95%
percentile interval from the project's task-level bootstrap (pipeline.metrics.bootstrap's draws over the shared
tasks, one draw sequence for every quantity: docs/explanation/intervals.md); and the first rollouts of each flip
kind, with links into `pexec view`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TypedDict
from urllib.parse import urlencode

import duckdb
import numpy as np

from pipeline.core.arrow import pa
from pipeline.core.errors import DiffError
from pipeline.core.intervals import MIN_TASKS
from pipeline.core.metric_catalogue import AUC_UNIT
from pipeline.metrics import bootstrap
from pipeline.metrics.cohorts import label_columns
from pipeline.metrics.drift import Threshold, split_threshold
from pipeline.metrics.duck import connect, fetch, rollout_columns, run_sql, set_variables
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, VIEW_PORT, BootstrapSettings, Method

KINDS = ("valid_to_invalid", "invalid_to_valid", "check_changed", "cause_changed")
EXAMPLES = 5  # rollouts listed per flip kind
VIEW_URL = f"http://127.0.0.1:{VIEW_PORT}"
# --fail-on names of the paired diff: counts of flipped steps, the flip rate, and the paired changes B − A.
PAIRED_METRICS = {
    "flips": "flipped steps (any kind)",
    "to_invalid": "steps valid in A, invalid in B",
    "to_valid": "steps invalid in A, valid in B",
    "flip_rate": "flipped steps / steps compared",
    "ter": "TER B − A over the shared rollouts",
    "auc_pec": "AUC-PEC B − A over the shared rollouts",
    "fed": "mean FED B − A over the shared rollouts",
}
# ratio name -> (numerator columns B, A or None, denominator, scale) over paired_task_sums
_RATIOS: dict[str, tuple[str, str | None, str, float]] = {
    "flip_rate": ("flips", None, "steps", 1.0),
    "ter": ("exec_b", "exec_a", "n", 1.0),
    "auc_pec": ("auc_b", "auc_a", "n", AUC_UNIT),
    "fed": ("fed_b", "fed_a", "n", 1.0),
}
_COLUMNS = ("n", "exec_a", "exec_b", "auc_a", "auc_b", "fed_a", "fed_b", "steps", "flips", "to_invalid", "to_valid")


class SharedRollouts(TypedDict):
    """The row of view paired_shared (sql/paired_shared.sql)."""

    rollouts_a: int
    rollouts_b: int
    shared: int  # rollouts in both: the same rollout id for the same task


class Repeats(TypedDict):
    """The row of table paired_repeats (sql/paired_steps.sql): rows beyond one per rollout id."""

    repeated_a: int
    repeated_b: int


class PairedCounts(TypedDict):
    """The row of table paired_counts (sql/paired_steps.sql): rollouts of A, of B, shared, then over the shared
    ones that no run calls a harness error (`compared`)."""

    rollouts_a: int
    rollouts_b: int
    shared: int
    harness_errors: int
    compared: int
    tasks: int
    fed_changed: int
    became_not_executable: int
    became_executable: int
    calls_differ: int  # rollouts whose number of calls differs


class KindCount(TypedDict):
    """Steps of one kind (a flip kind of KINDS, `same`, or `unmatched`: in one run only), and their rollouts and
    tasks."""

    steps: int
    rollouts: int
    tasks: int


class KindRow(KindCount):
    """A row of view paired_kinds."""

    kind: str


class Change(TypedDict):
    """The flip rate (`value`, no A or B), or a paired change B − A (`value`) of a rate over the shared rollouts,
    with its percentile interval."""

    a: float | None
    b: float | None
    value: float | None
    lo: float | None
    hi: float | None
    replicates_used: int  # replicates whose denominator is not 0


class FlipsByTool(TypedDict):
    kind: str
    tool: str
    steps: int


class FlipsByCause(TypedDict):
    kind: str
    cause_a: str | None
    cause_b: str | None
    steps: int


class FlipsByCheck(TypedDict):
    kind: str
    check_a: str | None
    check_b: str | None
    steps: int


class ExampleRow(TypedDict):
    """A row of view paired_examples: a rollout with flips of `kind`, and where each run keeps it."""

    kind: str
    rollout_id: str
    task_id: str
    first_step: int
    steps: int
    run_a: str
    shard_a: str
    run_b: str
    shard_b: str


class Example(TypedDict):
    """An example rollout of a flip kind, with its links into `pexec view`."""

    kind: str
    rollout_id: str
    task_id: str
    first_step: int  # its first flipped step
    steps: int  # its flipped steps
    link_a: str
    link_b: str


class PairedBootstrap(TypedDict):
    method: Method
    B: int
    seed: int
    level: float
    clusters: Literal["task"]


class PairedJSON(PairedCounts):
    """`pexec diff --paired --json`: the counts, the steps per kind, the flip rate and the paired changes, the
    flips by tool, cause and check, and example rollouts."""

    kind: Literal["paired"]
    flips: int
    steps: dict[str, KindCount]
    flip_rate: Change
    ter: Change
    auc_pec: Change
    fed: Change
    by_tool: list[FlipsByTool]
    by_cause: list[FlipsByCause]
    by_check: list[FlipsByCheck]
    examples: list[Example]
    bootstrap: PairedBootstrap


@dataclass(frozen=True)
class PairedDiff:
    counts: PairedCounts
    kinds: dict[str, KindCount]  # kind (and same, unmatched) -> its steps, rollouts, tasks
    changes: dict[str, Change]  # flip_rate, ter, auc_pec, fed (the keys of _RATIOS)
    by_tool: list[FlipsByTool]
    by_cause: list[FlipsByCause]
    by_check: list[FlipsByCheck]
    examples: list[Example]
    settings: BootstrapSettings

    @property
    def flips(self) -> int:
        return sum(self.steps(k) for k in KINDS)

    def steps(self, kind: str) -> int:
        """Steps of `kind` (0 when there is none)."""
        counted = self.kinds.get(kind)
        return 0 if counted is None else counted["steps"]

    def to_json(self) -> PairedJSON:
        s = self.settings
        changes = self.changes
        return {
            "kind": "paired",
            **self.counts,
            "flips": self.flips,
            "steps": self.kinds,
            "flip_rate": changes["flip_rate"],
            "ter": changes["ter"],
            "auc_pec": changes["auc_pec"],
            "fed": changes["fed"],
            "by_tool": self.by_tool,
            "by_cause": self.by_cause,
            "by_check": self.by_check,
            "examples": self.examples,
            "bootstrap": {"method": s.method, "B": s.B, "seed": s.seed, "level": s.level, "clusters": "task"},
        }


def shared_rollouts(run_a: Run, run_b: Run) -> tuple[int, int, int]:
    """(rollouts in A, in B, in both): whether the runs can be compared step by step. A rollout is in both when
    both runs have its rollout id for the same task."""
    with _connection(run_a, run_b) as con:
        run_sql(con, "metrics/paired_shared")
        row = fetch(con, "paired_shared", SharedRollouts)[0]
    return int(row["rollouts_a"]), int(row["rollouts_b"]), int(row["shared"])


class Relabelled(TypedDict):
    """The row of table paired_relabelled (sql/paired_labels.sql)."""

    relabelled: int  # shared rollouts whose condition labels differ between the runs
    example: _Example | None  # the first of them by id: its labels in A and B


class _Example(TypedDict):
    a: str
    b: str


def relabelled_rollouts(run_a: Run, run_b: Run) -> Relabelled:
    """The shared rollouts whose condition labels (those both runs have) differ: not the same rollouts, but ids that
    collide, which a step-level comparison would pair."""
    with _connection(run_a, run_b) as con:
        labels_a = label_columns(rollout_columns(con, "a_rollouts_all"))
        common = [c for c in label_columns(rollout_columns(con, "b_rollouts_all")) if c in labels_a]
        if not common:
            return {"relabelled": 0, "example": None}
        set_variables(con, label_cols=common)
        run_sql(con, "metrics/paired_labels")
        return fetch(con, "paired_relabelled", Relabelled)[0]


def paired_diff(
    run_a: Run, run_b: Run, settings: BootstrapSettings = DEFAULT_BOOTSTRAP, examples: int = EXAMPLES
) -> PairedDiff:
    """The step-level verdict diff of two runs of the same rollouts (refused when they share none)."""
    method = settings.method
    if method not in ("multinomial", "poisson"):
        raise DiffError(f"the paired diff draws multinomial or poisson bootstrap replicates, not {method}")
    with _connection(run_a, run_b, examples) as con:
        run_sql(con, "metrics/paired_steps")
        repeats = fetch(con, "paired_repeats", Repeats)[0]
        if repeats["repeated_a"] or repeats["repeated_b"]:
            raise DiffError(
                f"rollout ids repeat within a run (A {repeats['repeated_a']}, B {repeats['repeated_b']} extra rows): "
                "a step-level comparison needs each rollout once per run (give one run folder, not several)"
            )
        counts = fetch(con, "paired_counts", PairedCounts)[0]
        if not counts["compared"]:
            raise DiffError(
                f"the runs share no scored rollout ({counts['rollouts_a']} in A, {counts['rollouts_b']} in B, "
                f"{counts['shared']} shared, {counts['harness_errors']} of them harness errors): nothing to pair"
            )
        kinds: dict[str, KindCount] = {
            r["kind"]: {"steps": r["steps"], "rollouts": r["rollouts"], "tasks": r["tasks"]}
            for r in fetch(con, "paired_kinds", KindRow)
        }
        sums = con.execute("SELECT * EXCLUDE (task_id) FROM paired_task_sums").fetchnumpy()
        per_task = np.stack([np.asarray(sums[c], dtype=np.int64) for c in _COLUMNS], axis=1)
        result = PairedDiff(
            counts=counts,
            kinds=kinds,
            changes=_changes(per_task, settings, method),
            by_tool=fetch(con, "paired_by_tool", FlipsByTool),
            by_cause=fetch(con, "paired_by_cause", FlipsByCause),
            by_check=fetch(con, "paired_by_check", FlipsByCheck),
            examples=[_linked(r) for r in fetch(con, "paired_examples", ExampleRow)],
            settings=settings,
        )
    return result


@contextmanager
def _connection(run_a: Run, run_b: Run, examples: int = EXAMPLES) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection with both runs' rollouts and steps as views (a_rollouts, b_rollouts, a_steps, b_steps)."""
    con = connect(run_a.snapshot.root)
    try:
        if run_b.snapshot.root.fs is not run_a.snapshot.root.fs:
            run_b.snapshot.root.attach(con)
        set_variables(
            con,
            a_rollouts_files=run_a.snapshot.parts("rollouts"),
            b_rollouts_files=run_b.snapshot.parts("rollouts"),
            a_steps_files=run_a.snapshot.parts("steps"),
            b_steps_files=run_b.snapshot.parts("steps"),
            auc_unit=AUC_UNIT,
            examples=examples,
        )
        run_sql(con, "metrics/paired_views")
        yield con
    finally:
        con.close()


def _changes(sums: np.ndarray, settings: BootstrapSettings, method: bootstrap.Method) -> dict[str, Change]:
    """Point values and percentile intervals of the flip rate and the paired changes, from the per-task sums of
    the shared tasks (one bootstrap: the same task draws for every quantity)."""
    col = {c: i for i, c in enumerate(_COLUMNS)}
    totals = sums.sum(axis=0)
    reps = _replicate_totals(sums, settings, method)  # B x columns
    out: dict[str, Change] = {}
    for name, (num_b, num_a, den, scale) in _RATIOS.items():
        d = totals[col[den]] * scale
        a = None if num_a is None or not d else float(totals[col[num_a]] / d)
        b = None if not d or num_a is None else float(totals[col[num_b]] / d)  # a rate has no A and B
        value = None if not d else float(totals[col[num_b]] / d) - (a or 0.0)
        lo = hi = None
        keep = reps[:, col[den]] > 0
        # Below the project's floor for a task bootstrap (pipeline.core.intervals) its percentiles say nothing.
        if value is not None and keep.any() and len(sums) >= MIN_TASKS:
            r = reps[keep]
            diffs = r[:, col[num_b]] / (r[:, col[den]] * scale)
            if num_a is not None:
                diffs = diffs - r[:, col[num_a]] / (r[:, col[den]] * scale)
            lo, hi = (float(v) for v in np.quantile(diffs, settings.quantiles))
        out[name] = {"a": a, "b": b, "value": value, "lo": lo, "hi": hi, "replicates_used": int(keep.sum())}
    return out


def _replicate_totals(sums: np.ndarray, settings: BootstrapSettings, method: bootstrap.Method) -> np.ndarray:
    """Per replicate, the column totals of the resampled tasks (the exact limb sums recombined as integers)."""
    batches = list(bootstrap.replicate_sums([sums], _COLUMNS, settings.seed, settings.B, method))
    totals = [[0] * len(_COLUMNS) for _ in range(settings.B)]
    index = {c: i for i, c in enumerate(_COLUMNS)}
    for row in pa.Table.from_batches(batches, bootstrap.LIMBS).to_pylist() if batches else []:
        totals[row["b"]][index[row["part"]]] += int(row["total"]) << row["shift"]
    return np.array(totals, dtype=np.float64)


def _linked(row: ExampleRow) -> Example:
    """An example rollout with its links into `pexec view RUN_A` and `pexec view RUN_B` (default address)."""
    rid = row["rollout_id"]
    return {
        "kind": row["kind"],
        "rollout_id": rid,
        "task_id": row["task_id"],
        "first_step": row["first_step"],
        "steps": row["steps"],
        "link_a": f"{VIEW_URL}/rollout?{urlencode({'run': row['run_a'], 'shard': row['shard_a'], 'id': rid})}",
        "link_b": f"{VIEW_URL}/rollout?{urlencode({'run': row['run_b'], 'shard': row['shard_b'], 'id': rid})}",
    }


def parse_paired_threshold(text: str) -> Threshold:
    """`flips>0`, `to_invalid>=10`, `flip_rate>0.01`, `ter<-0.02`: a paired metric, an operator, a number."""
    metric, op, value = split_threshold(text)
    if metric not in PAIRED_METRICS:
        raise DiffError(f"--fail-on {metric!r} is not a measure of the paired diff; one of {', '.join(PAIRED_METRICS)}")
    return Threshold(metric, op, value)


def paired_breaches(result: PairedDiff, thresholds: Sequence[Threshold]) -> list[str]:
    """One line per threshold crossed by the paired diff (B − A, or the count / rate itself)."""
    lines = []
    counts = {
        "flips": result.flips,
        "to_invalid": result.steps("valid_to_invalid"),
        "to_valid": result.steps("invalid_to_valid"),
    }
    for t in thresholds:
        if t.metric in counts:
            value, where = float(counts[t.metric]), f"{counts[t.metric]} step(s)"
        else:
            c = result.changes[t.metric]
            if c["value"] is None:
                raise DiffError(f"--fail-on {t} cannot be evaluated: {t.metric} is undefined (no step compared)")
            value, where = c["value"], f"{c['value']:+.4f} [{_num(c['lo'])}, {_num(c['hi'])}]"
        if t.breached(value):
            lines.append(f"breach {t}: {PAIRED_METRICS[t.metric]} = {where}")
    return lines


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:+.4f}"
