"""The run's output tables (DESIGN §4): Arrow tables from results (written by pipeline.storage.run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipeline.model import Reject, RolloutResult

_ID_FIELDS = [
    ("run_id", pa.string()),
    ("rollout_id", pa.string()),
    ("task_id", pa.string()),
    ("benchmark", pa.string()),
]
_STEP_FIELDS = [
    ("step", pa.int32()),
    ("turn", pa.int32()),
    ("tool", pa.string()),
    ("valid", pa.bool_()),
    ("prefix_executable", pa.bool_()),
    ("check", pa.string()),
    ("cause", pa.string()),
    ("detail", pa.string()),
    ("decided_by", pa.string()),
    ("output_match", pa.bool_()),
]
_ROLLOUT_FIELDS = [
    ("T", pa.int32()),
    ("fed", pa.int32()),
    ("executable", pa.bool_()),
    ("auc_term", pa.float64()),
    ("success", pa.bool_()),
    ("recovered", pa.bool_()),
    ("first_cause", pa.string()),
    ("n_invalid", pa.int32()),
    ("n_output_mismatch", pa.int32()),
]
REJECT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("shard", pa.string()),
        ("source", pa.string()),
        ("location", pa.string()),
        ("reason", pa.string()),
        ("raw", pa.string()),
    ]
)


def steps_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels = _label_names(results)
    cols: dict[str, list[Any]] = {name: [] for name, _ in [*_ID_FIELDS, *_STEP_FIELDS]}
    label_cols: dict[str, list[Any]] = {name: [] for name in labels}
    for result in results:
        r = result.rollout
        for s in result.steps:
            for name, value in (
                ("run_id", run_id),
                ("rollout_id", r.rollout_id),
                ("task_id", r.task_id),
                ("benchmark", r.benchmark),
            ):
                cols[name].append(value)
            for name in labels:
                label_cols[name].append(r.labels.get(name))
            for name, _ in _STEP_FIELDS:
                cols[name].append(getattr(s, name))
    return _table(cols, label_cols, _STEP_FIELDS)


def rollouts_table(run_id: str, results: Sequence[RolloutResult]) -> pa.Table:
    labels = _label_names(results)
    cost_names = sorted({k for res in results for k in res.rollout.cost})
    cols: dict[str, list[Any]] = {name: [] for name, _ in [*_ID_FIELDS, *_ROLLOUT_FIELDS]}
    label_cols: dict[str, list[Any]] = {name: [] for name in labels}
    cost_cols: dict[str, list[Any]] = {f"cost_{k}": [] for k in cost_names}
    for res in results:
        r = res.rollout
        n_invalid = sum(not s.valid for s in res.steps)
        row = {
            "run_id": run_id,
            "rollout_id": r.rollout_id,
            "task_id": r.task_id,
            "benchmark": r.benchmark,
            "T": res.T,
            "fed": res.fed,
            "executable": res.executable,
            "auc_term": res.auc_term,
            "success": r.success,
            "recovered": res.recovered,
            "first_cause": res.first_cause,
            "n_invalid": n_invalid,
            "n_output_mismatch": sum(s.output_match is False for s in res.steps),
        }
        for name, value in row.items():
            cols[name].append(value)
        for name in labels:
            label_cols[name].append(r.labels.get(name))
        for k in cost_names:
            cost_cols[f"cost_{k}"].append(r.cost.get(k))
    table = _table(cols, label_cols, _ROLLOUT_FIELDS)
    for name, values in cost_cols.items():
        table = table.append_column(pa.field(name, pa.float64()), pa.array(values, pa.float64()))
    return table


def rejects_table(run_id: str, shard: str, rejects: Sequence[Reject]) -> pa.Table:
    return pa.table(
        {
            "run_id": [run_id] * len(rejects),
            "shard": [shard] * len(rejects),
            "source": [r.source for r in rejects],
            "location": [r.location for r in rejects],
            "reason": [r.reason for r in rejects],
            "raw": [r.raw for r in rejects],
        },
        schema=REJECT_SCHEMA,
    )


def _label_names(results: Sequence[RolloutResult]) -> list[str]:
    return sorted({k for res in results for k in res.rollout.labels})


def _table(cols: dict[str, list[Any]], label_cols: dict[str, list[Any]], fields: list) -> pa.Table:
    # Column order: ids, labels, then the table's own fields.
    arrays, schema = [], []
    for name, kind in _ID_FIELDS:
        arrays.append(pa.array(cols[name], kind))
        schema.append(pa.field(name, kind))
    for name, values in label_cols.items():
        arrays.append(pa.array(values, pa.string()))
        schema.append(pa.field(name, pa.string()))
    for name, kind in fields:
        arrays.append(pa.array(cols[name], kind))
        schema.append(pa.field(name, kind))
    return pa.Table.from_arrays(arrays, schema=pa.schema(schema))
