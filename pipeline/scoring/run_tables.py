"""The run's output tables (columns: pipeline.core.run_schema) as Arrow tables; pipeline.storage.run writes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np

from pipeline.core.arrow import pa
from pipeline.core.effects import WRITES
from pipeline.core.model import Reject, Rollout, RolloutResult
from pipeline.core.run_schema import ATTRIBUTE_PREFIX, REJECTS, ROLLOUTS, STEPS, RunTable, arrow_schema

V = TypeVar("V")


def steps_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    rollouts = [res.rollout for res in results]
    per_rollout, labels, attributes = _rollout_columns(run_id, rollouts)
    schema = arrow_schema(STEPS, labels, attributes=attributes)
    fields = [c.name for c in STEPS.fields if c.name != "status"]
    # Built column by column (a transpose in C) rather than cell by cell: this runs on every step. The rollout's
    # own columns are built once per rollout and repeated for its steps by Arrow.
    step_rows = map(attrgetter(*fields), (s for res in results for s in res.all_steps))
    cols: dict[str, Sequence[Any]] = {name: () for name in schema.names}
    cols |= zip(fields, zip(*step_rows, strict=True), strict=False)
    per_step = np.repeat(np.arange(len(results)), [len(res.steps) + len(res.user_steps) for res in results])
    arrays = {f.name: pa.array(cols[f.name], f.type) for f in schema if f.name not in per_rollout}
    arrays |= {name: pa.array(values, schema.field(name).type).take(per_step) for name, values in per_rollout.items()}
    return pa.Table.from_arrays([arrays[name] for name in schema.names], schema=schema)


def rollouts_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    """One row per result (docs/explanation/definitions.md, "Per-rollout quantities"), built as typed column
    buffers: the rollout's own columns a list each, its derived quantities from one walk over its steps."""
    rollouts = [res.rollout for res in results]
    columns, labels, attributes = _rollout_columns(run_id, rollouts)
    costs = _case_folded([r.cost for r in rollouts])
    schema = arrow_schema(ROLLOUTS, labels, [f"cost_{k}" for k in costs], attributes)
    cols: dict[str, Sequence[Any]] = {**columns, "success": [r.success for r in rollouts]}
    cols |= {f"cost_{name}": values for name, values in costs.items()}
    derived = _Derived()
    for res in results:
        derived.add(res)
    cols |= vars(derived)
    return _table(cols, schema)


class _Derived:
    """The per-rollout quantities, a list per column, each rollout's from one walk over its steps."""

    def __init__(self) -> None:
        self.T: list[int] = []
        self.fed: list[int] = []
        self.executable: list[bool] = []
        self.auc_term: list[float] = []
        self.recovered: list[bool | None] = []
        self.first_cause: list[str | None] = []
        self.n_invalid: list[int] = []
        self.n_output_mismatch: list[int] = []
        self.n_output_compared: list[int] = []
        self.diverged_before_fed: list[bool] = []
        # the harm columns: writes are calls of write or irreversible tools; write_fed is the first invalid write's
        # depth among the writes (as fed among all calls), the weighted AUC term the weight before fed over all
        self.n_writes: list[int] = []
        self.n_unclassified: list[int] = []
        self.n_invalid_irreversible: list[int] = []
        self.write_fed: list[int | None] = []
        self.write_auc_term: list[float | None] = []
        self.weighted_auc_term: list[float] = []
        # first-error depth when only some checks count (`report --sensitivity`): under schema-only a step is
        # invalid when its first failed check is S, under schema+dependency when it is S or D
        self.fed_schema: list[int] = []
        self.fed_schema_dependency: list[int] = []
        self.user_T: list[int | None] = []
        self.user_fed: list[int | None] = []
        self.user_n_invalid: list[int | None] = []

    def add(self, res: RolloutResult) -> None:
        steps = res.steps
        T, fed = len(steps), res.fed
        invalid = mismatched = compared = writes = unclassified = invalid_irreversible = 0
        diverged = False
        write_fed = fed_schema = fed_schema_dependency = None
        weights, before = [], []  # summed as lists, in step order, as `sum` adds them
        for s in steps:
            valid, match, effect, check = s.valid, s.output_match, s.effect, s.failed_check
            if not valid:
                invalid += 1
            if match is not None:
                compared += 1
                if match is False:
                    mismatched += 1
                    diverged = diverged or s.step < fed
            if effect is None:
                unclassified += 1
            elif effect in WRITES:
                writes += 1
                if write_fed is None and not valid:
                    write_fed = writes
                if effect == "irreversible" and not valid:
                    invalid_irreversible += 1
            if check == "S" and fed_schema is None:
                fed_schema = s.step
            if check in ("S", "D") and fed_schema_dependency is None:
                fed_schema_dependency = s.step
            weights.append(s.effect_weight)
            if s.step < fed:
                before.append(s.effect_weight)
        if writes and write_fed is None:
            write_fed = writes + 1
        self.T.append(T)
        self.fed.append(fed)
        self.executable.append(res.executable)
        self.auc_term.append(res.auc_term)
        self.recovered.append(res.recovered)
        self.first_cause.append(res.first_cause)
        self.n_invalid.append(invalid)
        self.n_output_mismatch.append(mismatched)
        self.n_output_compared.append(compared)
        self.diverged_before_fed.append(diverged)
        self.n_writes.append(writes)
        self.n_unclassified.append(unclassified)
        self.n_invalid_irreversible.append(invalid_irreversible)
        self.write_fed.append(write_fed)
        self.write_auc_term.append(None if write_fed is None else (write_fed - 1) / writes)
        self.weighted_auc_term.append(1.0 if not steps else sum(before) / sum(weights))
        self.fed_schema.append(T + 1 if fed_schema is None else fed_schema)
        self.fed_schema_dependency.append(T + 1 if fed_schema_dependency is None else fed_schema_dependency)
        user = res.user_steps
        self.user_T.append(len(user) if user else None)
        self.user_fed.append(res.user_fed)
        self.user_n_invalid.append(sum(not s.valid for s in user) if user else None)


def rejects_table(run_id: str, shard: str, rejects: Sequence[Reject]) -> pa.Table:
    cols = {"run_id": [run_id] * len(rejects), "shard": [shard] * len(rejects)}
    cols |= {name: [getattr(r, name) for r in rejects] for name in ("source", "location", "reason", "raw")}
    return _table(cols, arrow_schema(REJECTS))


def combined(parts: Sequence[pa.Table], table: RunTable) -> pa.Table:
    """One table of `table`'s parts (built from successive batches of results): the label, attribute and cost
    columns of all of them, in the order one call over all the results would give, absent ones null."""
    if len(parts) == 1:
        return parts[0]
    merged = pa.concat_tables(parts, promote_options="default")
    return merged.select(unified_schema([merged.schema], table).names)


def unified_schema(schemas: Iterable[pa.Schema], table: RunTable) -> pa.Schema:
    """The schema of `table` whose parts have `schemas`: every label, attribute and cost column any of them has, in
    the order one call over all their results would give (`combined`'s)."""
    fixed = {c.name for c in table.columns}
    extra = {n for s in schemas for n in s.names if n not in fixed}
    labels = sorted(n for n in extra if not n.startswith((ATTRIBUTE_PREFIX, "cost_")))
    attributes = sorted(n for n in extra if n.startswith(ATTRIBUTE_PREFIX))
    costs = sorted(n for n in extra if n.startswith("cost_"))
    return arrow_schema(table, labels, costs, attributes)


def conformed(part: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """`part` with `schema`'s columns in its order, those it lacks null (as `combined` gives them)."""
    n = part.num_rows
    have = set(part.schema.names)
    columns = [part.column(f.name) if f.name in have else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _rollout_columns(run_id: str, rollouts: Sequence[Rollout]) -> tuple[dict[str, Sequence[Any]], list[str], list[str]]:
    """What both tables hold of each rollout, a list per column: its ids, its labels and attributes (one column per
    name whatever its letter case: `_case_folded`) and its status; with the label and attribute column names."""
    labels, attributes = _case_folded([r.labels for r in rollouts]), _case_folded([r.attributes for r in rollouts])
    columns: dict[str, Sequence[Any]] = {
        "run_id": [run_id] * len(rollouts),
        "rollout_id": [r.rollout_id for r in rollouts],
        "task_id": [r.task_id for r in rollouts],
        "benchmark": [r.benchmark for r in rollouts],
        **labels,
        **{ATTRIBUTE_PREFIX + name: values for name, values in attributes.items()},
        "status": [r.status for r in rollouts],
    }
    return columns, list(labels), [ATTRIBUTE_PREFIX + name for name in attributes]


def _case_folded(rows: Sequence[Mapping[str, V]]) -> dict[str, list[V | None]]:
    """The rows' keys as columns in name order, a value per row (None where a row has none). Keys that differ only
    in letter case are one column, named by the spelling that sorts first: SQL names are case-insensitive, and
    DuckDB would read two such columns as one name twice (renaming one `x_1`). A rollout that holds two spellings
    of one name is a reject (pipeline.core.records), so no row gives one column two values."""
    column: dict[str, str] = {}
    for name in sorted({k for row in rows for k in row}):
        column.setdefault(name.lower(), name)
    out: dict[str, list[V | None]] = {name: [None] * len(rows) for name in column.values()}
    for i, row in enumerate(rows):
        for key, value in row.items():
            out[column[key.lower()]][i] = value
    return out


def _table(cols: Mapping[str, Sequence[object]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)
