"""`pexec spec draft`: a night of logs read as `score` reads them — the same plan of shards, the same readers inside
Ray tasks (or in this process with `inline`) — each shard turned into its evidence (small sums), the evidence
merged in the driver, and the draft spec folder written from it. No process holds more than one shard's rollouts.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import orjson

from pipeline.apps.drafting.evidence import Evidence, observe
from pipeline.apps.drafting.proposal import DraftSettings, drafted, grounded, rules, spec_toml, tools_json
from pipeline.core.errors import DraftError, InvalidRecord
from pipeline.core.records import parse_rollout
from pipeline.scoring.driver import completed, plan
from pipeline.scoring.settings import ScoreSettings
from pipeline.scoring.shard import TaskSettings, read_records
from pipeline.storage.shards import RecordError, Shard


@dataclass
class ShardEvidence:
    evidence: Evidence
    read: int = 0
    rejected: int = 0
    peak_mib: float = 0.0  # the peak resident memory of the process that read the shard (VmHWM)


@dataclass
class Draft:
    """What `draft` wrote and from what."""

    out: Path
    evidence: Evidence
    read: int
    rejected: int
    shards: int
    proposed: dict[str, list[str]] = field(default_factory=dict)  # tool -> grounded paths proposed
    rule_candidates: int = 0
    worker_peak_mib: float = 0.0  # the largest peak resident memory of a process that read shards


def shard_evidence(shard: Shard, settings: TaskSettings) -> ShardEvidence:
    """One shard's evidence: its rollouts read by the scoring path's reader, observed one at a time."""
    out = ShardEvidence(Evidence())
    for _, record in read_records(shard, settings):
        out.read += 1
        if isinstance(record, RecordError):
            out.rejected += 1
            continue
        try:
            rollout = parse_rollout(record)
        except InvalidRecord:
            out.rejected += 1
            continue
        observe([rollout], out.evidence)
    out.peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
    return out


def draft(
    sources: Sequence[str],
    out: str,
    reading: ScoreSettings,
    settings: DraftSettings | None = None,
    *,
    inline: bool = False,
    address: str | None = None,
    num_cpus: int | None = None,
) -> Draft:
    """Read `sources` as `reading` says (format, options, shard size), gather the evidence and write the draft spec
    folder `out` (refused when it exists and is not empty)."""
    settings = settings or DraftSettings()
    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise DraftError(f"{out} exists and is not empty: give a new folder for the draft")
    source = reading.raw_input(list(sources))
    if source is None and len(sources) != 1:
        raise DraftError("a canonical store is one file or folder; several sources need --format")
    if source is not None and source.shuffle is not None:
        raise DraftError(
            f"{source.fmt}: its rollouts span files and are assembled by a shuffle, which spec draft does not run: "
            f"copy them to a canonical store first (`pexec ingest {source.fmt} … --out STORE`) and draft from it"
        )
    shard_plan = plan(sources[0] if source is None else " ".join(sources), reading.shard_bytes,
                      reading.storage_options, source)  # fmt: skip
    task = TaskSettings(run="", run_id="draft", storage_options=reading.storage_options, source=source)
    merged = ShardEvidence(Evidence())
    for part in _gather(shard_plan.shards, task, inline, address, num_cpus):
        merged.evidence.merge(part.evidence)
        merged.read += part.read
        merged.rejected += part.rejected
        merged.peak_mib = max(merged.peak_mib, part.peak_mib)
    ev = merged.evidence
    if ev.rollouts == 0:
        raise DraftError(
            f"no rollout could be read from {' '.join(sources)} ({merged.rejected} rejected): nothing to draft from"
        )
    if ev.calls == 0:
        raise DraftError(f"{ev.rollouts} rollouts read, none with a tool call: nothing to draft from")
    header = _header(sources, reading, settings, merged, len(shard_plan.shards))
    folder.mkdir(parents=True, exist_ok=True)
    tools = tools_json(ev)
    (folder / "tools.json").write_bytes(orjson.dumps(tools, option=orjson.OPT_INDENT_2) + b"\n")
    (folder / "spec.toml").write_text(spec_toml(ev, settings, folder.name, header), encoding="utf-8")
    (folder / "initial_state.json").write_text("{}\n", encoding="utf-8")
    kept = drafted(ev)
    proposed = {n: [g.path for g in grounded(t, settings) if g.proposed] for n, t in sorted(kept.items())}
    n_rules = sum(len(rules(t, settings)) for t in kept.values())
    return Draft(folder, ev, merged.read, merged.rejected, len(shard_plan.shards), proposed, n_rules, merged.peak_mib)


def _gather(shards: list[Shard], task: TaskSettings, inline: bool, address: str | None, num_cpus: int | None) -> Any:
    if inline:
        for shard in shards:
            yield shard_evidence(shard, task)
        return
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                 logging_level=logging.WARNING)  # fmt: skip
    remote = ray.remote(max_retries=2)(shard_evidence)  # a lost worker is retried; a shard's error fails the draft
    window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
    for _, part in completed(shards, lambda s: remote.remote(s, task), window, lambda: None):
        yield part


def _header(
    sources: Sequence[str], reading: ScoreSettings, s: DraftSettings, merged: ShardEvidence, shards: int
) -> list[str]:
    ev = merged.evidence
    window = f"{ev.first_date} to {ev.last_date}" if ev.first_date else "no dates in the logs"
    options = " ".join(f"{k}={v}" for k, v in sorted(reading.options.items())) or "none"
    return [
        "A DRAFT spec mined from logs by `pexec spec draft`: review every line before scoring with it.",
        f"source: {' '.join(sources)} (format {reading.format}, options {options})",
        f"window: {window}; {ev.rollouts} rollouts, {ev.calls} calls, {merged.rejected} records rejected, "
        f"{shards} shards",
        f"thresholds: grounded when a value occurred earlier (a user or system message, an earlier output) in "
        f">= {s.min_share:.0%} of >= {s.min_calls} values of calls the log does not show failing, identifiers only "
        f"unless --free-text ({s.free_text}), no value in >= {s.min_share:.0%} of them, values only messages carried "
        f"used by >= {s.min_reuse:g} tasks each; "
        f"rule candidates with support >= {s.rule_support} and precision >= {s.rule_precision:.0%}",
        f"written {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} by pexec {_version()}",
        "Use: pexec score LOGS --env observed --spec THIS_FOLDER ; pexec guard replay LOGS --spec THIS_FOLDER",
        "",
    ]


def _version() -> str:
    try:
        return version("pexec")
    except PackageNotFoundError:
        return "unknown"
