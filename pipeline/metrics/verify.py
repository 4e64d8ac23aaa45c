"""`pexec verify RUN`: every part of every committed shard checked against what its marker recorded.

A reader checks only the tables it reads (pipeline.metrics.completeness); this reads them all: each part whole,
against its recorded size and SHA-256 digest, and its Parquet footer against its recorded row count. A part of a
layout 1 run has no recorded digest: its size and rows are checked, and it is reported as unverified, never as
verified. Parts are read by a few threads at a time: hashing releases the GIL, and an object store answers
several reads at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipeline.metrics.completeness import RunState, Snapshot, take_snapshot
from pipeline.storage.run import TABLES, PartFacts, check_part, part_rel, recorded_part

THREADS = 4  # parts read at once


@dataclass(frozen=True)
class DamagedPart:
    """A part that does not match its marker: its URL and what is wrong, in words."""

    url: str
    problem: str


@dataclass(frozen=True)
class Verification:
    """What `verify` found under a path."""

    runs: int  # runs under the path
    shards: int  # committed shards checked
    parts: int  # parts checked
    verified: int  # parts whose size, digest and rows match their marker
    unverified: tuple[str, ...]  # parts with no recorded digest (layout 1) whose size and rows match
    damaged: tuple[DamagedPart, ...]  # parts that do not match (missing, cut short, changed, other rows)
    incomplete: tuple[str, ...]  # runs that did not finish (their committed shards were checked)
    repairs: tuple[str, ...]  # per run with a damaged part: the command that rescores its damaged shards

    @property
    def ok(self) -> bool:
        """Every part verified."""
        return not self.damaged and not self.unverified


def verify_run(url: str, storage_options: dict[str, Any] | None = None) -> Verification:
    """Check every part of every committed shard of every run under `url` (RunNotFound when there is none)."""
    snapshot = take_snapshot(url, storage_options, partial=True)
    jobs = [
        (run, key, table, recorded_part(marker, table))
        for run in snapshot.runs
        for key, marker in sorted(run.recorded.items())
        for table in TABLES
    ]
    with ThreadPoolExecutor(THREADS) as pool:
        problems = list(pool.map(lambda job: _check(snapshot, *job), jobs))
    damaged, unverified, repairs = [], [], []
    for (run, key, table, recorded), problem in zip(jobs, problems, strict=True):
        part = snapshot.root.file(part_rel(table, key, run.rel))
        if problem:
            damaged.append(DamagedPart(part, problem))
            if run.repair not in repairs:
                repairs.append(run.repair)
        elif not recorded.digest:
            unverified.append(part)
    return Verification(
        runs=len(snapshot.runs),
        shards=sum(len(r.recorded) for r in snapshot.runs),
        parts=len(jobs),
        verified=len(jobs) - len(damaged) - len(unverified),
        unverified=tuple(unverified),
        damaged=tuple(damaged),
        incomplete=tuple(
            snapshot.root.file(r.rel) if r.rel else snapshot.root.url for r in snapshot.runs if not r.complete
        ),
        repairs=tuple(repairs),
    )


def _check(snapshot: Snapshot, run: RunState, key: str, table: str, recorded: PartFacts) -> str:
    return check_part(snapshot.root, part_rel(table, key, run.rel), recorded, rows=True)
