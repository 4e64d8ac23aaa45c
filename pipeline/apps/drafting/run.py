"""`pexec spec draft`: a night of logs read as `score` reads them — the same plan of shards, the same readers inside
Ray tasks (or in this process with `inline`) — each shard turned into its evidence (small sums), the evidence
merged in the driver, and the draft spec folder written from it. No process holds more than one shard's rollouts.
A format whose rollouts span files (OTel spans) is first shuffled as `score` shuffles it (pipeline.scoring.shuffle),
staged in the draft folder's `_staging/` (removed when done), and its partitions are the shards.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import orjson

from pipeline.apps.drafting.evidence import Evidence, observe
from pipeline.apps.drafting.proposal import DraftSettings, drafted, grounded, rules, spec_toml, tools_json
from pipeline.core.errors import DraftError, InvalidRecord
from pipeline.core.ray_start import start_ray
from pipeline.core.records import parse_rollout
from pipeline.ingest.registry import formats, get_format
from pipeline.ingest.sharded import RawSource
from pipeline.scoring.driver import ShardPlan, completed, plan
from pipeline.scoring.memory import peak_mib
from pipeline.scoring.settings import ScoreSettings
from pipeline.scoring.shard import TaskSettings, read_records
from pipeline.scoring.shuffle import shuffle_rounds, staging
from pipeline.storage.fs import remove_all
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
    out.peak_mib = peak_mib()
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
    if reading.format != "canonical" and reading.format in formats() and not get_format(reading.format).reads_files:
        raise DraftError(
            f"{reading.format} is read from a server, not from files: copy the night to a canonical store first "
            f"(`pexec ingest {reading.format} … --out STORE`) and draft from it (`pexec spec draft STORE --out DIR`)"
        )
    source = reading.raw_input(list(sources))
    if source is None and len(sources) != 1:
        raise DraftError("a canonical store is one file or folder; several sources need --format")
    shard_plan = plan(sources[0] if source is None else " ".join(sources), reading.shard_bytes,
                      reading.storage_options, source)  # fmt: skip
    runner = _Runner(inline, address, num_cpus)
    shuffled = source is not None and source.shuffle is not None
    # A shuffle's rounds stage their rows under the draft folder (absolute: a Ray worker works elsewhere).
    run = str(folder.resolve()) if shuffled else ""
    task = TaskSettings(run=run, run_id="draft", storage_options=reading.storage_options, source=source)
    merged = ShardEvidence(Evidence())
    created = not folder.exists()
    try:
        shards = shard_plan.shards
        if source is not None and shuffled:
            folder.mkdir(parents=True, exist_ok=True)
            shards = _shuffle(source, run, shard_plan, reading.shard_bytes, runner)
        for part in runner.run(shard_evidence, shards, task):
            merged.evidence.merge(part.evidence)
            merged.read += part.read
            merged.rejected += part.rejected
            merged.peak_mib = max(merged.peak_mib, part.peak_mib)
    finally:
        if shuffled:
            _unstage(folder, run, created)
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


@dataclass(frozen=True)
class _Runner:
    """Where tasks run: Ray tasks (local Ray on `num_cpus`, or the cluster at `address`), at most two per CPU in
    flight, or one after another in this process (`inline`)."""

    inline: bool
    address: str | None
    num_cpus: int | None

    def run(self, fn: Any, shards: list[Shard], *args: Any) -> Iterator[Any]:
        if self.inline:
            for shard in shards:
                yield fn(shard, *args)
            return
        remote = self._ray().remote(max_retries=2)(fn)  # a lost worker is retried; a shard's error fails the draft
        for _, part in completed(shards, lambda s: remote.remote(s, *args), 2 * self.cpus(), lambda: None):
            yield part

    def cpus(self) -> int:
        return 1 if self.inline else max(1, int(self._ray().cluster_resources().get("CPU", 1)))

    def _ray(self) -> Any:
        import ray

        start_ray(self.address, self.num_cpus)  # as scoring starts it: on loopback, quiet
        return ray


def _shuffle(source: RawSource, run: str, shard_plan: ShardPlan, shard_bytes: int, runner: _Runner) -> list[Shard]:
    """The rounds of `score`'s shuffle over the planned input shards; the final partitions as shards."""
    return shuffle_rounds(
        source, run, shard_plan.shards, shard_plan.total_bytes, shard_bytes, runner.cpus(),
        lambda *task: list(runner.run(*task)),
    )  # fmt: skip


def _unstage(folder: Path, run: str, created: bool) -> None:
    """Remove the shuffle's staged rows, and the draft folder too when this draft created it and wrote nothing."""
    remove_all(staging(run), None)
    if created and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


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
