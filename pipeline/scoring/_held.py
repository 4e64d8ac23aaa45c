"""A shard's steps and rollouts as its task converts them, batch by batch: held in memory up to a bound, past it
spilled to Arrow files in the node's temporary folder, then written as the shard's parts.

A task over a run of shuffle partitions (or a large shard) converts far more results than one partition's: held
whole, its tables would grow with the run. Spilled, the task holds at most the bound of converted tables; the part is
then written from the spilled batches read back one at a time, each given the part's unified columns (the batches'
label, attribute and cost columns differ), a row group per bound's worth. A shard that never passed the bound is
written as before, one table in one `write_table`, so its bytes do not change.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipeline.core.arrow import pa
from pipeline.core.run_schema import RunTable
from pipeline.scoring.run_tables import combined, conformed, unified_schema
from pipeline.storage.fs import StorageOptions
from pipeline.storage.run import PartFacts, write_part, write_part_stream

# Spill files are read once, on the same node, right after: LZ4 costs little CPU and halves the disk they take.
_SPILLED = pa.ipc.IpcWriteOptions(compression="lz4")


@dataclass
class _Table:
    """One of the shard's tables: its batches held, and its spill files in the order they were written."""

    table: RunTable
    held: list[pa.Table] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    schemas: dict[pa.Schema, None] = field(default_factory=dict)  # every batch's, in order of first appearance


class HeldParts:
    """The steps and rollouts tables of a shard's converted batches, held until `limit` bytes of Arrow and then
    spilled. A context manager: the spill folder is removed when it exits, however the shard ends."""

    def __init__(self, tables: dict[str, RunTable], limit: int) -> None:
        self.limit = limit
        self.tables = {name: _Table(table) for name, table in tables.items()}
        self.held = 0  # bytes of Arrow held, all tables together
        self.batches = 0
        self.folder: str | None = None

    def __enter__(self) -> HeldParts:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    @property
    def spilled(self) -> bool:
        return any(t.files for t in self.tables.values())

    def add(self, batch: dict[str, pa.Table]) -> None:
        """One converted batch: a table for each of the shard's tables."""
        for name, table in batch.items():
            held = self.tables[name]
            held.held.append(table)
            held.schemas.setdefault(table.schema)
            self.held += table.nbytes
        self.batches += 1
        if self.held > self.limit:
            self._spill()

    def _spill(self) -> None:
        self.folder = self.folder or tempfile.mkdtemp(prefix="pexec-parts-")
        for name, held in self.tables.items():
            # a file per run of batches with one schema (an IPC stream has one); most shards have one schema
            runs: list[list[pa.Table]] = []
            for table in held.held:
                if runs and runs[-1][0].schema == table.schema:
                    runs[-1].append(table)
                else:
                    runs.append([table])
            for run in runs:
                path = f"{self.folder}/{name}-{len(held.files):06d}.arrow"
                with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, run[0].schema, options=_SPILLED) as writer:
                    for table in run:
                        writer.write_table(table)
                held.files.append(path)
            held.held = []
        self.held = 0
        pa.default_memory_pool().release_unused()

    def write(self, run: str, shard_key: str, storage_options: StorageOptions | None) -> dict[str, PartFacts]:
        """Write each table's part. Nothing spilled: the batches combined in memory, written in one `write_table`.
        Else every batch, spilled or held, in order, streamed to the part a row group per `limit` bytes."""
        if not self.spilled:
            return {
                name: write_part(run, name, shard_key, combined(held.held, held.table), storage_options)
                for name, held in self.tables.items()
            }
        written = {}
        for name, held in self.tables.items():
            schema = unified_schema(held.schemas, held.table)
            groups = _groups(self._batches(name), schema, self.limit)
            written[name] = write_part_stream(run, name, shard_key, schema, groups, storage_options)
        return written

    def _batches(self, name: str) -> Iterator[pa.RecordBatch]:
        """Every batch of table `name` in the order it was added: the spilled ones read back (read, not mapped:
        mapped pages would count in the task's resident memory), then those held."""
        held = self.tables[name]
        for path in held.files:
            with pa.OSFile(path, "rb") as f, pa.ipc.open_stream(f) as reader:
                yield from reader
        for table in held.held:
            yield from table.to_batches()


def _groups(batches: Iterator[pa.RecordBatch], schema: pa.Schema, limit: int) -> Iterator[pa.Table]:
    """The batches given `schema`'s columns and gathered into tables of about `limit` bytes (a row group each)."""
    group: list[pa.Table] = []
    size = 0
    for batch in batches:
        group.append(conformed(batch, schema))
        size += batch.nbytes
        if size >= limit:
            yield pa.concat_tables(group)
            group, size = [], 0
    if group:
        yield pa.concat_tables(group)
