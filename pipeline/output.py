"""The run's output tables (DESIGN §4): Arrow tables from results, Parquet parts, the manifest.

Part files are named after the shard they come from, so a retried or repeated shard overwrites its own
parts and never duplicates rows. `_manifest.json` is written last: a run without it is incomplete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from pipeline.model import Reject, RolloutResult

MANIFEST = "_manifest.json"
SHARD_MARKERS = "_shards"  # one JSON report per committed shard: what a rerun may reuse
TABLES = ("steps", "rollouts", "rejects")

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


def open_for_write(url: str, storage_options: dict | None = None) -> Any:
    """Open `url` for writing. Folders are made on local disks only: on an object store a missing bucket
    must be an error, never created behind the user's back."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if isinstance(fs, LocalFileSystem):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    return fs.open(path, "wb")


def part_path(run: str, table: str, shard_key: str) -> str:
    return f"{run.rstrip('/')}/{table}/part-{shard_key}.parquet"


def write_part(run: str, table_name: str, shard_key: str, table: pa.Table, storage_options: dict | None = None) -> None:
    with open_for_write(part_path(run, table_name, shard_key), storage_options) as f:
        pq.write_table(table, f, compression="zstd")


def remove_manifest(run: str, storage_options: dict | None = None) -> None:
    """Mark the run incomplete while it is being (re)written."""
    fs, path = fsspec.core.url_to_fs(f"{run.rstrip('/')}/{MANIFEST}", **(storage_options or {}))
    if fs.exists(path):
        fs.rm(path)


def remove_stale_parts(run: str, keep: set[str], storage_options: dict | None = None) -> list[str]:
    """Delete the parts and markers of shards not in this run's plan (left by an earlier plan of the run)."""
    removed = []
    for folder_name, prefix, suffix in [*((t, "part-", ".parquet") for t in TABLES), (SHARD_MARKERS, "", ".json")]:
        fs, folder = fsspec.core.url_to_fs(f"{run.rstrip('/')}/{folder_name}", **(storage_options or {}))
        if not fs.exists(folder):
            continue
        for path in fs.ls(folder, detail=False):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix) : -len(suffix)] not in keep:
                fs.rm(path)
                removed.append(path)
    return removed


def write_shard_marker(run: str, key: str, report: dict[str, Any], storage_options: dict | None = None) -> None:
    with open_for_write(f"{run.rstrip('/')}/{SHARD_MARKERS}/{key}.json", storage_options) as f:
        f.write(orjson.dumps(report))


def read_shard_markers(run: str, storage_options: dict | None = None) -> dict[str, dict[str, Any]]:
    """Reports of the shards committed so far, by shard key."""
    fs, folder = fsspec.core.url_to_fs(f"{run.rstrip('/')}/{SHARD_MARKERS}", **(storage_options or {}))
    if not fs.exists(folder):
        return {}
    markers = {}
    for path in fs.ls(folder, detail=False):
        if path.endswith(".json"):
            with fs.open(path, "rb") as f:
                try:
                    markers[path.rsplit("/", 1)[-1][:-5]] = orjson.loads(f.read())
                except orjson.JSONDecodeError:
                    continue  # a marker cut short: the shard is simply scored again
    return markers


def write_manifest(run: str, manifest: dict[str, Any], storage_options: dict | None = None) -> None:
    with open_for_write(f"{run.rstrip('/')}/{MANIFEST}", storage_options) as f:
        f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def read_manifest(run: str, storage_options: dict | None = None) -> dict[str, Any] | None:
    fs, path = fsspec.core.url_to_fs(f"{run.rstrip('/')}/{MANIFEST}", **(storage_options or {}))
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        return orjson.loads(f.read())
