"""A run prefix (docs/explanation/data-model.md, "The run folder"): its Parquet parts, shard markers and manifest, and
what DuckDB reads of it.

Part files are named after the shard they come from, so a retried or repeated shard overwrites its own
parts and never duplicates rows. Each part's size, rows and SHA-256 digest are recorded in its shard's marker
(`PartFacts`), so that a reader, a rerun and `pexec verify` can tell a part from a damaged or replaced one
(`check_part`). `_manifest.json` is written last: a run without it is incomplete.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import pyarrow.parquet as pq

from pipeline.core.arrow import pa
from pipeline.core.errors import RunFolderError, StorageError, UnknownLayout
from pipeline.core.run_folder import DIGEST, Manifest, Plan, RunFile, ShardMarker, decode, encode
from pipeline.core.text import public_url
from pipeline.storage.fs import StorageOptions, filesystem, is_local, open_whole

if TYPE_CHECKING:
    import duckdb

MANIFEST = "_manifest.json"
PLAN = "_plan.json"  # the shards a (re)run will cover, written before the first of them is scored
SHARD_MARKERS = "_shards"  # one JSON report per committed shard: what a rerun may reuse
TABLES = ("steps", "rollouts", "rejects")
_BLOCK = 2**20  # bytes hashed at a time while a part is read back


@dataclass(frozen=True)
class PartFacts:
    """What a part is, as its shard's marker records it: size in bytes, rows, and `sha256:<hex>` of its bytes."""

    size: int
    rows: int
    digest: str


def part_path(run: str, table: str, shard_key: str) -> str:
    return f"{run.rstrip('/')}/{table}/part-{shard_key}.parquet"


def part_rel(table: str, shard_key: str, rel: str = "") -> str:
    """A part's path relative to the path read (`rel`: its run's folder below it, "" for the path itself)."""
    return f"{rel}{'/' if rel else ''}{table}/part-{shard_key}.parquet"


def write_part(
    run: str, table_name: str, shard_key: str, table: pa.Table, storage_options: StorageOptions | None = None
) -> PartFacts:
    """Write one part, a table in memory, in one `write_table` (one row group up to Parquet's default rows); returns
    its size, rows and digest (recorded in the shard's marker, checked when the part is read and before it is
    reused)."""
    return write_part_stream(run, table_name, shard_key, table.schema, [table], storage_options)


def write_part_stream(
    run: str,
    table_name: str,
    shard_key: str,
    schema: pa.Schema,
    tables: Iterable[pa.Table],
    storage_options: StorageOptions | None = None,
) -> PartFacts:
    """Write one part from `tables` of `schema`, taken one at a time (each at least one row group), never the whole
    part: the Parquet writer's sink hashes the bytes as they go to storage, so the bytes hashed are the bytes written,
    in one pass. One table gives the bytes `pq.write_table` gives."""
    rows = 0
    with open_whole(part_path(run, table_name, shard_key), storage_options) as f:
        sink = _HashingSink(f)
        with pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema, compression="zstd") as writer:
            for table in tables:
                writer.write_table(table)
                rows += table.num_rows
    return PartFacts(size=sink.size, rows=rows, digest=f"{DIGEST}:{sink.sha.hexdigest()}")


class _HashingSink:
    """What the Parquet writer writes to: the bytes go on to `f`, counted and hashed as they pass. Closing it leaves
    `f` open (its opener closes it, which is what commits it on an object store)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha, self.size, self.closed = f, hashlib.sha256(), 0, False

    def write(self, data: bytes | memoryview) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.f.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.closed = True


def part_digest(f: IO[bytes]) -> tuple[int, str]:
    """Size and `sha256:<hex>` of the bytes left in `f`, read in blocks (a part is never held whole)."""
    h = hashlib.sha256()
    size = 0
    while block := f.read(_BLOCK):
        h.update(block)
        size += len(block)
    return size, f"{DIGEST}:{h.hexdigest()}"


def part_facts(run: str, table_name: str, shard_key: str, storage_options: StorageOptions | None = None) -> PartFacts:
    """The size, rows and digest of a part already written (a run assembled without scoring)."""
    fs, path = filesystem(part_path(run, table_name, shard_key), storage_options)
    with fs.open(path, "rb") as f:
        size, digest = part_digest(f)
    with fs.open(path, "rb") as f:
        rows = pq.read_metadata(f).num_rows
    return PartFacts(size=size, rows=rows, digest=digest)


_COUNTED = {"rollouts": "scored", "steps": "steps", "rejects": "rejected"}  # a layout 1 marker's rows per part


def recorded_part(marker: ShardMarker, table: str) -> PartFacts:
    """The part of `table` as `marker` records it. A layout 1 marker records no digest (`digest` is ""): its size
    and rows (its counts) can be checked, its bytes cannot."""
    rows = marker.part_rows.get(table, getattr(marker, _COUNTED[table]))
    return PartFacts(size=marker.parts.get(table, -1), rows=rows, digest=marker.part_digests.get(table, ""))


def check_part(root: RunPrefix, rel: str, expected: PartFacts, rows: bool = False) -> str:
    """What is wrong with the part at `rel` below `root` against what its marker recorded: "" when it has the
    recorded size and digest (and, with `rows`, its footer the recorded row count), else in words (missing, cut
    short, changed, unreadable). Reads the whole part; StorageError when storage fails. Of a part recorded without
    a digest (layout 1) only the size and rows are checked: the caller says it is unverified."""
    path = f"{root.path}/{rel}"
    # A listing this process cached before another process (a Ray task) wrote the part would say it is missing.
    root.fs.invalidate_cache(path.rsplit("/", 1)[0])
    try:
        with root.fs.open(path, "rb") as f:
            size, digest = part_digest(f)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise StorageError(f"cannot read {root.file(rel)}: {exc}") from exc
    if size != expected.size:
        return f"{size:,} bytes where {expected.size:,} were written"
    if expected.digest and digest != expected.digest:
        return f"its bytes changed since it was written ({digest[:15]}… where {expected.digest[:15]}… was recorded)"
    return footer_problem(root, rel, expected.rows) if rows else ""


def footer_problem(root: RunPrefix, rel: str, rows: int) -> str:
    """What is wrong with the Parquet footer of the part at `rel` against the rows its marker recorded ("" when
    it is readable and counts them): reads the footer only."""
    try:
        with root.fs.open(f"{root.path}/{rel}", "rb") as f:
            found = pq.read_metadata(f).num_rows
    except FileNotFoundError:
        return "missing"
    except (OSError, pa.ArrowException) as exc:
        return f"not a readable Parquet file ({' '.join(str(exc).split())})"
    return f"{found:,} rows where {rows:,} were written" if found != rows else ""


def part_sizes(run: str, storage_options: StorageOptions | None = None) -> dict[str, dict[str, int]]:
    """The size of every part file now in the run, by table and shard key."""
    sizes: dict[str, dict[str, int]] = {}
    for table in TABLES:
        fs, folder = filesystem(f"{run.rstrip('/')}/{table}", storage_options)
        fs.invalidate_cache(folder)  # another process may have changed it since this one last looked
        found = fs.ls(folder, detail=True) if fs.exists(folder) else []
        sizes[table] = {
            name[5:-8]: int(info["size"])
            for info in found
            if (name := info["name"].rsplit("/", 1)[-1]).startswith("part-") and name.endswith(".parquet")
        }
    return sizes


def remove_manifest(run: str, storage_options: StorageOptions | None = None) -> None:
    """Mark the run incomplete while it is being (re)written."""
    fs, path = filesystem(f"{run.rstrip('/')}/{MANIFEST}", storage_options)
    if fs.exists(path):
        fs.rm(path)


def remove_stale_parts(run: str, keep: set[str], storage_options: StorageOptions | None = None) -> list[str]:
    """Delete the parts and markers of shards not in this run's plan (left by an earlier plan of the run)."""
    removed = []
    for folder_name, prefix, suffix in [*((t, "part-", ".parquet") for t in TABLES), (SHARD_MARKERS, "", ".json")]:
        fs, folder = filesystem(f"{run.rstrip('/')}/{folder_name}", storage_options)
        if not fs.exists(folder):
            continue
        for path in fs.ls(folder, detail=False):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix) : -len(suffix)] not in keep:
                fs.rm(path)
                removed.append(path)
    return removed


def write_shard_marker(run: str, marker: ShardMarker, storage_options: StorageOptions | None = None) -> None:
    """Commit a shard: its marker, written after its three parts."""
    with open_whole(f"{run.rstrip('/')}/{SHARD_MARKERS}/{marker.shard}.json", storage_options) as f:
        f.write(encode(marker, indent=False))


def read_shard_markers(
    run: RunPrefix | str,
    storage_options: StorageOptions | None = None,
    *,
    rel: str = "",
    listed: Iterable[str] | None = None,
) -> dict[str, ShardMarker]:
    """The markers of the shards committed so far in the run at `rel` below `run`, by shard key. `listed`: the
    files of a listing already taken (relative to `run`), else the markers' folder is listed now. A marker cut
    short or damaged is no commit (the shard is simply scored again); one of a newer layout is refused."""
    root = _prefix(run, storage_options)
    folder = f"{rel}/{SHARD_MARKERS}/" if rel else f"{SHARD_MARKERS}/"
    if listed is None:
        path = f"{root.path}/{folder}"
        root.fs.invalidate_cache(path.rstrip("/"))  # another process may have committed shards since
        found = root.fs.ls(path, detail=False) if root.fs.exists(path) else []
        listed = [f"{folder}{p.rsplit('/', 1)[-1]}" for p in found]
    markers = {}
    for name in sorted(listed):
        key = name[len(folder) : -len(".json")]
        if name.startswith(folder) and name.endswith(".json") and "/" not in key:
            try:
                marker = _read(root, name, ShardMarker)
            except UnknownLayout:
                raise
            except RunFolderError:
                continue
            if marker is not None:  # None: removed since it was listed
                markers[key] = marker
    return markers


def write_manifest(run: str, manifest: Manifest, storage_options: StorageOptions | None = None) -> None:
    """Commit the run: its manifest, written last."""
    with open_whole(f"{run.rstrip('/')}/{MANIFEST}", storage_options) as f:
        f.write(encode(manifest))


def read_manifest(
    run: RunPrefix | str, storage_options: StorageOptions | None = None, *, rel: str = ""
) -> Manifest | None:
    """The manifest of the run at `rel` below `run` (a RunPrefix, or a URL opened with `storage_options`); None
    when it has none. RunFolderError when it is damaged or of a layout this pexec does not read."""
    return _read(_prefix(run, storage_options), f"{rel}/{MANIFEST}" if rel else MANIFEST, Manifest)


def write_plan(run: str, plan: Plan, storage_options: StorageOptions | None = None) -> None:
    """What the run will cover, written before its first shard is scored."""
    with open_whole(f"{run.rstrip('/')}/{PLAN}", storage_options) as f:
        f.write(encode(plan))


def read_plan(run: RunPrefix | str, storage_options: StorageOptions | None = None, *, rel: str = "") -> Plan | None:
    """The plan of the run at `rel` below `run`; None when it has none (RunFolderError as `read_manifest`)."""
    return _read(_prefix(run, storage_options), f"{rel}/{PLAN}" if rel else PLAN, Plan)


def _prefix(run: RunPrefix | str, storage_options: StorageOptions | None) -> RunPrefix:
    return run if isinstance(run, RunPrefix) else RunPrefix(run, storage_options)


def _read(root: RunPrefix, rel: str, kind: type[RunFile]) -> RunFile | None:
    path = f"{root.path}/{rel}"
    try:
        with root.fs.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return decode(kind, data, root.file(rel))


class RunPrefix:
    """A run prefix as the DuckDB stage sees it: a local folder (made absolute) or an fsspec URL."""

    def __init__(self, run: str, storage_options: StorageOptions | None = None) -> None:
        try:
            self.fs, path = filesystem(run, storage_options)
        except (ValueError, ImportError) as exc:  # unknown protocol, or its package is not installed
            raise StorageError(f"cannot open run {run}: {exc}") from exc
        self.path = path.rstrip("/")
        self.local = is_local(self.fs)
        # What DuckDB is given: an absolute local path, or the URL itself (served by the filesystem that
        # `attach` registers).
        self.url = self.path if self.local else run.rstrip("/")

    def __repr__(self) -> str:  # the URL only: the filesystem holds the storage options (credentials)
        return f"RunPrefix({public_url(self.url)!r})"

    def file(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(f"{self.path}/{rel}"))

    def attach(self, con: duckdb.DuckDBPyConnection) -> None:
        """Let DuckDB read a remote run through its own fsspec filesystem (same credentials and endpoint as
        the rest of pexec); a local run is read from disk."""
        if not self.local:
            con.register_filesystem(self.fs)

    def write_parquet(self, rel: str, table: pa.Table) -> None:
        path = f"{self.path}/{rel}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        if self.local:
            # Write aside, then rename over the old file: a crash never leaves half a metrics table.
            tmp = f"{path}.tmp"
            pq.write_table(table, tmp)
            os.replace(tmp, path)
        else:
            with self.fs.open(path, "wb") as f:  # one object PUT: atomic on object stores
                pq.write_table(table, f)
