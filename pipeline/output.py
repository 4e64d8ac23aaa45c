"""The run's output tables (columns: pipeline.schema) as Arrow tables; pipeline.storage.run writes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipeline.model import Reject, RolloutResult
from pipeline.schema import ATTRIBUTE_PREFIX, REJECTS, ROLLOUTS, STEPS, arrow_schema


def steps_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels, attributes = _label_names(results), _attribute_names(results)
    schema = arrow_schema(STEPS, labels, attributes=[ATTRIBUTE_PREFIX + a for a in attributes])
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    rollout_cols = [cols[c] for c in schema.names[: len(STEPS.ids) + len(labels) + len(attributes)]] + [cols["status"]]
    field_cols = [(cols[c.name], c.name) for c in STEPS.fields if c.name != "status"]
    for result in results:
        r = result.rollout
        values = (
            run_id,
            r.rollout_id,
            r.task_id,
            r.benchmark,
            *(r.labels.get(name) for name in labels),
            *(r.attributes.get(name) for name in attributes),
            r.status,
        )
        for s in result.steps:
            for col, value in zip(rollout_cols, values, strict=True):
                col.append(value)
            for col, name in field_cols:
                col.append(getattr(s, name))
    return _table(cols, schema)


def rollouts_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels, attributes = _label_names(results), _attribute_names(results)
    cost_names = sorted({k for res in results for k in res.rollout.cost})
    schema = arrow_schema(
        ROLLOUTS, labels, [f"cost_{k}" for k in cost_names], [ATTRIBUTE_PREFIX + a for a in attributes]
    )
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    for res in results:
        r = res.rollout
        row = {
            "run_id": run_id,
            "rollout_id": r.rollout_id,
            "task_id": r.task_id,
            "benchmark": r.benchmark,
            **{name: r.labels.get(name) for name in labels},
            **{ATTRIBUTE_PREFIX + name: r.attributes.get(name) for name in attributes},
            "status": r.status,
            "T": res.T,
            "fed": res.fed,
            "executable": res.executable,
            "auc_term": res.auc_term,
            "success": r.success,
            "recovered": res.recovered,
            "first_cause": res.first_cause,
            "n_invalid": sum(not s.valid for s in res.steps),
            "n_output_mismatch": sum(s.output_match is False for s in res.steps),
            "n_output_compared": sum(s.output_match is not None for s in res.steps),
            "diverged_before_fed": any(s.output_match is False for s in res.steps if s.step < res.fed),
            **{f"cost_{k}": r.cost.get(k) for k in cost_names},
        }
        for name, value in row.items():
            cols[name].append(value)
    return _table(cols, schema)


def rejects_table(run_id: str, shard: str, rejects: Sequence[Reject]) -> pa.Table:
    cols = {"run_id": [run_id] * len(rejects), "shard": [shard] * len(rejects)}
    cols |= {name: [getattr(r, name) for r in rejects] for name in ("source", "location", "reason", "raw")}
    return _table(cols, arrow_schema(REJECTS))


def _label_names(results: Sequence[RolloutResult]) -> list[str]:
    return sorted({k for res in results for k in res.rollout.labels})


def _attribute_names(results: Sequence[RolloutResult]) -> list[str]:
    return sorted({k for res in results for k in res.rollout.attributes})


def _table(cols: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)
