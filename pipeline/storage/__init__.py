"""Storage: every file pexec reads or writes, local or behind an fsspec URL, goes through this package.

fs.py      URL + storage options -> filesystem and path; listing, opening for read and write
shards.py  what input is read in: listed files, the shards cut from them, a record that could not be read
inputs.py  input stores: listing data files, planning shards, reading records with their location
stores.py  writing canonical stores (`synth`, `ingest`)
run.py     a run prefix: Parquet parts, shard markers, the manifest, what DuckDB reads
lease.py   one writer per run: the lease object on a run prefix
ids.py     duplicate rollout ids: those carried by more than one record of a store

Imports: core.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "fs",
    "ids",
    "inputs",
    "lease",
    "run",
    "shards",
    "stores",
]
