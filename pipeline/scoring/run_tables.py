"""The run's output tables (columns: pipeline.core.run_schema) as Arrow tables; pipeline.storage.run writes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, TypedDict

import numpy as np

from pipeline.core.arrow import pa
from pipeline.core.effects import WRITES
from pipeline.core.model import Reject, RolloutResult
from pipeline.core.run_schema import ATTRIBUTE_PREFIX, REJECTS, ROLLOUTS, STEPS, RunTable, arrow_schema


def steps_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels, attributes = _label_names(results), _attribute_names(results)
    schema = arrow_schema(STEPS, labels, attributes=[ATTRIBUTE_PREFIX + a for a in attributes])
    fields = [c.name for c in STEPS.fields if c.name != "status"]
    # Built column by column (a transpose in C) rather than cell by cell: this runs on every step. The rollout's
    # own columns are built once per rollout and repeated for its steps by Arrow.
    rollout_rows = [
        (
            run_id,
            r.rollout_id,
            r.task_id,
            r.benchmark,
            *(r.labels.get(name) for name in labels),
            *(r.attributes.get(name) for name in attributes),
            r.status,
        )
        for r in (res.rollout for res in results)
    ]
    step_rows = map(attrgetter(*fields), (s for res in results for s in res.all_steps))
    rollout_names = [*schema.names[: len(STEPS.ids) + len(labels) + len(attributes)], "status"]
    cols: dict[str, Sequence[Any]] = {name: () for name in schema.names}
    cols |= zip(fields, zip(*step_rows, strict=True), strict=False)
    per_step = np.repeat(np.arange(len(results)), [len(res.steps) + len(res.user_steps) for res in results])
    arrays = {f.name: pa.array(cols[f.name], f.type) for f in schema if f.name not in rollout_names}
    per_rollout = list(zip(*rollout_rows, strict=True)) or [()] * len(rollout_names)
    arrays |= {
        name: pa.array(values, schema.field(name).type).take(per_step)
        for name, values in zip(rollout_names, per_rollout, strict=True)
    }
    return pa.Table.from_arrays([arrays[name] for name in schema.names], schema=schema)


def rollouts_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels, attributes = _label_names(results), _attribute_names(results)
    cost_names = sorted({k for res in results for k in res.rollout.cost})
    schema = arrow_schema(
        ROLLOUTS, labels, [f"cost_{k}" for k in cost_names], [ATTRIBUTE_PREFIX + a for a in attributes]
    )
    rows = []
    for res in results:
        r, steps, fed = res.rollout, res.steps, res.fed
        compared = [s.output_match for s in steps if s.output_match is not None]
        rows.append(
            {
                "run_id": run_id,
                "rollout_id": r.rollout_id,
                "task_id": r.task_id,
                "benchmark": r.benchmark,
                **{name: r.labels.get(name) for name in labels},
                **{ATTRIBUTE_PREFIX + name: r.attributes.get(name) for name in attributes},
                "status": r.status,
                "T": res.T,
                "fed": fed,
                "executable": res.executable,
                "auc_term": res.auc_term,
                "success": r.success,
                "recovered": res.recovered,
                "first_cause": res.first_cause,
                "n_invalid": sum(not s.valid for s in steps),
                "n_output_mismatch": sum(m is False for m in compared),
                "n_output_compared": len(compared),
                "diverged_before_fed": any(s.output_match is False and s.step < fed for s in steps),
                **effect_columns(res),
                **check_levels(res),
                "user_T": len(res.user_steps) if res.user_steps else None,
                "user_fed": res.user_fed,
                "user_n_invalid": sum(not s.valid for s in res.user_steps) if res.user_steps else None,
                **{f"cost_{k}": r.cost.get(k) for k in cost_names},
            }
        )
    return _table({name: [row[name] for row in rows] for name in schema.names}, schema)


class EffectColumns(TypedDict):
    """A rollout's harm columns (pipeline.core.run_schema.ROLLOUTS)."""

    n_writes: int
    n_unclassified: int
    n_invalid_irreversible: int
    write_fed: int | None  # None without writes
    write_auc_term: float | None
    weighted_auc_term: float


class CheckLevels(TypedDict):
    """A rollout's first-error depths when only some checks count."""

    fed_schema: int
    fed_schema_dependency: int


def effect_columns(res: RolloutResult) -> EffectColumns:
    """The rollout's harm columns from its steps' effect classes (docs/explanation/definitions.md, "Per-rollout
    quantities"): writes (write or irreversible calls), unclassified calls, invalid irreversible calls, the first
    invalid write's depth among the writes (write_fed, as fed among all calls) and its AUC term, and the weighted AUC
    term."""
    writes = [s for s in res.steps if s.effect in WRITES]
    write_fed = next((i for i, s in enumerate(writes, start=1) if not s.valid), len(writes) + 1) if writes else None
    total = sum(s.effect_weight for s in res.steps)
    fed = res.fed
    before = sum(s.effect_weight for s in res.steps if s.step < fed)
    return {
        "n_writes": len(writes),
        "n_unclassified": sum(s.effect is None for s in res.steps),
        "n_invalid_irreversible": sum(s.effect == "irreversible" and not s.valid for s in res.steps),
        "write_fed": write_fed,
        "write_auc_term": None if write_fed is None else (write_fed - 1) / len(writes),
        "weighted_auc_term": 1.0 if not res.steps else before / total,
    }


def check_levels(res: RolloutResult) -> CheckLevels:
    """First-error depth when only some checks count (docs/explanation/definitions.md, "Per-rollout quantities"; `report
    --sensitivity`): a step counts as invalid under schema-only when its first failed check is S, under
    schema+dependency when it is S or D. From this one scoring pass; later verdicts were made in the state the stricter
    pass left (see there)."""
    T = res.T

    def fed(checks: tuple[str, ...]) -> int:
        return next((s.step for s in res.steps if s.failed_check in checks), T + 1)

    return {"fed_schema": fed(("S",)), "fed_schema_dependency": fed(("S", "D"))}


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
    fixed = {c.name for c in table.columns}
    extra = [n for n in merged.column_names if n not in fixed]
    labels = sorted(n for n in extra if not n.startswith((ATTRIBUTE_PREFIX, "cost_")))
    attributes = sorted(n for n in extra if n.startswith(ATTRIBUTE_PREFIX))
    costs = sorted(n for n in extra if n.startswith("cost_"))
    return merged.select(arrow_schema(table, labels, costs, attributes).names)


def _label_names(results: Sequence[RolloutResult]) -> list[str]:
    return sorted({k for res in results for k in res.rollout.labels})


def _attribute_names(results: Sequence[RolloutResult]) -> list[str]:
    return sorted({k for res in results for k in res.rollout.attributes})


def _table(cols: Mapping[str, Sequence[object]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)
