"""The run's output tables (columns: pipeline.schema): Arrow tables from results, Parquet parts, the manifest.

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
from pipeline.schema import REJECTS, ROLLOUTS, STEPS, arrow_schema

MANIFEST = "_manifest.json"
SHARD_MARKERS = "_shards"  # one JSON report per committed shard: what a rerun may reuse
TABLES = ("steps", "rollouts", "rejects")


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
