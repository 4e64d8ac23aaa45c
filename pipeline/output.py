"""The run's output tables (columns: pipeline.schema) as Arrow tables; pipeline.storage.run writes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipeline.model import Reject, RolloutResult
from pipeline.schema import REJECTS, ROLLOUTS, STEPS, arrow_schema


def steps_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels = _label_names(results)
    schema = arrow_schema(STEPS, labels)
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    id_cols = [cols[c.name] for c in STEPS.ids]
    label_cols = [cols[name] for name in labels]
    field_cols = [(cols[c.name], c.name) for c in STEPS.fields]
    for result in results:
        r = result.rollout
        ids = (run_id, r.rollout_id, r.task_id, r.benchmark)
        label_values = [r.labels.get(name) for name in labels]
        for s in result.steps:
            for col, value in zip(id_cols, ids, strict=True):
                col.append(value)
            for col, value in zip(label_cols, label_values, strict=True):
                col.append(value)
            for col, name in field_cols:
                col.append(getattr(s, name))
    return _table(cols, schema)


def rollouts_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels = _label_names(results)
    cost_names = sorted({k for res in results for k in res.rollout.cost})
    schema = arrow_schema(ROLLOUTS, labels, [f"cost_{k}" for k in cost_names])
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    for res in results:
        r = res.rollout
        row = {
            "run_id": run_id,
            "rollout_id": r.rollout_id,
            "task_id": r.task_id,
            "benchmark": r.benchmark,
            **{name: r.labels.get(name) for name in labels},
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


def _table(cols: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)
