"""Which runs lie under a path, whether each is complete, and what a partial read covers.

The one place a reader decides what it may read (docs/explanation/data-model.md, "Complete runs only"). The path is
listed once, and the snapshot taken then names every file any later table, view or query of the run reads, so a run that
gains a shard while it is being read does not change what one reader sees. A run is complete when its `_manifest.json`
is valid and every shard it lists has its three parts (steps, rollouts, rejects). Every reader (metrics, sql, report,
jobs) refuses anything else in one line that says what is missing and how to finish it, unless asked for a partial read:
then it reads only the parts of committed shards (a marker that matches the run's plan, all three parts present) and
states the coverage: shards and records read of the total the plan knows.

A part is checked against its shard's marker when it is first read: the snapshot hashes every part of a table the
first time a reader asks for that table's files (a run's rollouts for `metrics`, its steps too for `report`), and a
part whose size or SHA-256 digest is not the one recorded is refused in one line naming it and how to repair it
(PartDamaged), never read. A run of layout 1 records no digests: of its parts only the size (as listed) and the rows
of the footer are checked (`pexec verify` says they are unverified).

A path may hold several runs (nightly `date=…/` partitions read together): each is checked.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from pipeline.core.errors import (
    PartDamaged,
    RunFolderError,
    RunIncomplete,
    RunNotFound,
    StorageError,
    UnknownLayout,
)
from pipeline.core.run_folder import Manifest, Plan, PlannedShard, ShardMarker
from pipeline.core.text import public_url, some
from pipeline.storage.run import (
    MANIFEST,
    PLAN,
    SHARD_MARKERS,
    TABLES,
    PartFacts,
    RunPrefix,
    check_part,
    footer_problem,
    part_rel,
    read_manifest,
    read_plan,
    read_shard_markers,
    recorded_part,
)

_SHOWN = 3  # missing files named in a message, the rest counted


@dataclass(frozen=True)
class RunState:
    """One run under the path read: what can be read of it and what it should hold."""

    rel: str  # the run's folder below the path read ("" for the path itself)
    complete: bool
    keys: tuple[str, ...]  # the readable shards
    shards_total: int | None  # planned shards; None when no plan was recorded
    rollouts: int  # rollouts those shards read (scored + rejected)
    rollouts_total: int | None  # rollouts in the whole input; None when the plan cannot count them (JSON Lines)
    input_bytes: int | None = None  # input bytes those shards span; None when unknown
    input_bytes_total: int | None = None
    missing: str = ""  # what is missing, "" when complete
    fix: str = ""  # how to finish the run, "" when complete
    recorded: Mapping[str, ShardMarker] = field(
        default_factory=dict, repr=False, compare=False
    )  # the readable shards' markers
    repair: str = ""  # the command that rescores a shard whose part is damaged

    @property
    def shards(self) -> int:
        """Shards whose parts can be read."""
        return len(self.keys)


class CoverageJSON(TypedDict):
    """Coverage as JSON: the `partial` object of every output of a partial read."""

    shards: int
    shards_total: int | None
    rollouts: int
    rollouts_total: int | None
    input_bytes: int | None
    input_bytes_total: int | None
    incomplete_runs: list[str]


@dataclass(frozen=True)
class Coverage:
    """What a partial read covers, summed over the runs read (the `partial` object of every output): a total is
    None when it is not known."""

    shards: int
    shards_total: int | None
    rollouts: int
    rollouts_total: int | None
    input_bytes: int | None
    input_bytes_total: int | None
    incomplete_runs: list[str]

    def as_json(self) -> CoverageJSON:
        """The `partial` object of a JSON output (`metrics --json`, a cohort's dict)."""
        return CoverageJSON(
            shards=self.shards,
            shards_total=self.shards_total,
            rollouts=self.rollouts,
            rollouts_total=self.rollouts_total,
            input_bytes=self.input_bytes,
            input_bytes_total=self.input_bytes_total,
            incomplete_runs=list(self.incomplete_runs),
        )

    @classmethod
    def from_json(cls, value: CoverageJSON) -> Coverage:
        return cls(**value)

    def describe(self) -> str:
        """The one-line warning every output of a partial read carries."""
        shards = f"{self.shards:,} of {_of(self.shards_total)} shards"
        rollouts = f"{self.rollouts:,} of {_of(self.rollouts_total)} rollouts"
        if self.input_bytes is not None and self.input_bytes_total:
            rollouts += f", {self.input_bytes / 2**20:,.1f} of {self.input_bytes_total / 2**20:,.1f} MiB of input"
        runs = ", ".join(self.incomplete_runs)
        return f"PARTIAL RUN: these numbers cover {shards} ({rollouts}); incomplete: {runs}"


@dataclass(frozen=True)
class Snapshot:
    """The runs under a path and the part files a reader reads (only those: never a stray or unfinished part),
    as listed once."""

    root: RunPrefix
    runs: tuple[RunState, ...]
    files: frozenset[str]  # every file under the path when it was listed, relative to it
    sizes: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)  # of `files`, as listed
    # Tables whose parts were checked against their markers (each once per snapshot, when first read).
    checked: set[str] = field(default_factory=set, repr=False, compare=False)
    _checking: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __repr__(self) -> str:  # not the file list, which grows with the run
        return f"Snapshot({self.root!r}, {self.describe()})"

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.runs)

    def describe(self) -> str:
        """`complete: 7 shards, 4,000 rollouts` (runs counted when the path holds several), or for a partial
        read `partial: 3 of 7 shards, 1,200 of 4,000 rollouts`."""
        runs = f"{len(self.runs)} runs, " if len(self.runs) > 1 else ""
        shards = sum(r.shards for r in self.runs)
        rollouts = sum(r.rollouts for r in self.runs)
        if self.complete:
            return f"complete: {runs}{shards:,} shards, {rollouts:,} rollouts"
        shards_total = _of(_total(r.shards_total for r in self.runs))
        rollouts_total = _of(_total(r.rollouts_total for r in self.runs))
        return f"partial: {runs}{shards:,} of {shards_total} shards, {rollouts:,} of {rollouts_total} rollouts"

    def rejected(self) -> int:
        """Records the readable shards rejected at scoring (rows of their rejects parts), as their markers count
        them: every shard read has one."""
        return sum(r.recorded[key].rejected for r in self.runs for key in r.keys)

    def scored(self) -> int:
        """Rollouts the readable shards scored (rows of their rollouts parts), as their markers count them."""
        return sum(r.recorded[key].scored for r in self.runs for key in r.keys)

    def parts(self, table: str) -> list[str]:
        """URLs of `table`'s part files of the readable shards, as DuckDB reads them; the first call for a table
        checks each of its parts against its marker (PartDamaged for one that does not match)."""
        with self._checking:
            if table not in self.checked:
                self._check(table)
                self.checked.add(table)
        return [self.root.file(part_rel(table, key, r.rel)) for r in self.runs for key in r.keys]

    def _check(self, table: str) -> None:
        for r in self.runs:
            for key in r.keys:
                marker = r.recorded.get(key)
                if marker is None:
                    continue
                recorded = recorded_part(marker, table)
                rel = part_rel(table, key, r.rel)
                if recorded.digest:
                    problem = check_part(self.root, rel, recorded)
                else:  # layout 1: its size (as listed) and its footer's rows can be checked; its bytes cannot
                    problem = _layout_1_problem(self.root, rel, recorded, self.sizes.get(rel))
                if problem:
                    raise PartDamaged(
                        f"damaged part {self.root.file(rel)}: {problem}; {r.repair} rescores its shard "
                        f"(`pexec verify {_name(self.root, r)}` lists every damaged part)"
                    )

    def partial(self) -> Coverage | None:
        """None for complete runs; else what a partial read covers."""
        if self.complete:
            return None
        return Coverage(
            shards=sum(r.shards for r in self.runs),
            shards_total=_total(r.shards_total for r in self.runs),
            rollouts=sum(r.rollouts for r in self.runs),
            rollouts_total=_total(r.rollouts_total for r in self.runs),
            input_bytes=_total(r.input_bytes for r in self.runs),
            input_bytes_total=_total(r.input_bytes_total for r in self.runs),
            incomplete_runs=[self.root.file(r.rel) if r.rel else self.root.url for r in self.runs if not r.complete],
        )


def _layout_1_problem(root: RunPrefix, rel: str, recorded: PartFacts, listed: int | None) -> str:
    if recorded.size >= 0 and listed is not None and listed != recorded.size:
        return f"{listed:,} bytes where {recorded.size:,} were written"
    return footer_problem(root, rel, recorded.rows)


def take_snapshot(run: str, storage_options: dict[str, Any] | None = None, partial: bool = False) -> Snapshot:
    """Check every run under `run`; raise RunIncomplete unless all are complete or `partial` is asked for."""
    root = RunPrefix(run, storage_options)
    try:
        sizes = _listing(root)
        files = set(sizes)
    except FileNotFoundError:
        raise RunNotFound(f"no run at {run}") from None
    except OSError as exc:
        raise StorageError(f"cannot list run {run}: {exc}") from exc
    folders = _run_folders(files)
    if not folders:
        raise RunNotFound(f"no scored run under {run} (no {MANIFEST}, {PLAN} or part files)")
    try:
        snapshot = Snapshot(root, tuple(_state(root, rel, files) for rel in folders), frozenset(files), sizes)
    except OSError as exc:  # a file listed a moment ago is gone (a rerun started), or storage failed
        raise StorageError(f"cannot read run {run}: {exc}") from exc
    incomplete = [r for r in snapshot.runs if not r.complete]
    if incomplete and not partial:
        if len(snapshot.runs) == 1:
            what = f"run {run} is incomplete: {incomplete[0].missing}; {incomplete[0].fix}"
        else:
            runs = "; ".join(f"{_name(root, r)}: {r.missing}; {r.fix}" for r in incomplete)
            what = f"{len(incomplete)} of {len(snapshot.runs)} runs under {run} are incomplete: {runs}"
        raise RunIncomplete(f"{what} (or pass --partial to read only the committed shards; every output says so)")
    if not any(r.keys for r in snapshot.runs):
        raise RunNotFound(f"nothing readable under {run}: no shard has been committed yet")
    return snapshot


# --- internals ---------------------------------------------------------------------------------------


def _listing(root: RunPrefix) -> dict[str, int]:
    """Every file under the path, relative to it, with its size."""
    if not root.fs.exists(root.path):
        raise FileNotFoundError(root.path)
    base = root.path + "/"
    found: dict[str, dict[str, Any]] = root.fs.find(root.path, detail=True)
    return {p.removeprefix(base): int(info.get("size") or 0) for p, info in found.items()}


def _run_folders(files: set[str]) -> list[str]:
    """Folders (relative, "" for the path itself) holding a run: a manifest, a plan, markers or part files."""
    folders = set()
    for rel in files:
        *parent, name = rel.split("/")
        if name in (MANIFEST, PLAN):
            folders.add("/".join(parent))
        elif parent and (parent[-1] == SHARD_MARKERS or (parent[-1] in TABLES and name.startswith("part-"))):
            folders.add("/".join(parent[:-1]))
    return sorted(folders)


def rescore_command(manifest: Manifest, run: str) -> str:
    """The `pexec score` that scores the run's input into `run` again as the manifest says it was scored: its
    format, reader options and labels, environment, spec and checks. Without them a repair would rescore under the
    defaults, another environment and other checks, with exit 0."""
    s = manifest.settings
    words = ["pexec", "score", public_url(manifest.input.store), "--out", shlex.quote(public_url(run))]
    if s.read is not None:
        words += ["--format", shlex.quote(s.read.format)]
        words += [f"--option {shlex.quote(f'{k}={v}')}" for k, v in s.read.options]
        words += [f"--label {shlex.quote(f'{k}={v}')}" for k, v in s.read.labels]
        words += ["--option allow_no_calls=true"] if s.read.allow_no_calls else []
    if s.env is not None:
        words += ["--env", shlex.quote(s.env)]
    if s.options.spec is not None:
        words += ["--spec", shlex.quote(s.options.spec)]
    words += [f"--spec-dir {shlex.quote(d)}" for d in s.options.spec_dirs]
    if s.options.policy != "code":
        words += ["--policy", shlex.quote(s.options.policy)]
    return " ".join([*words, "--checks", ",".join(s.checks)])


def _state(root: RunPrefix, rel: str, files: set[str]) -> RunState:
    prefix = f"{rel}/" if rel else ""
    run = root.file(rel) if rel else root.url

    def has_parts(key: str) -> bool:
        return all(f"{prefix}{t}/part-{key}.parquet" in files for t in TABLES)

    has_manifest = f"{prefix}{MANIFEST}" in files
    manifest = _finished(root, rel) if has_manifest else None
    if manifest is not None:
        reports = {s.shard: s for s in manifest.shards}
        lost = [
            f"{t}/part-{k}.parquet" for k in reports for t in TABLES if f"{prefix}{t}/part-{k}.parquet" not in files
        ]
        keys = tuple(k for k in reports if has_parts(k))
        total = sum(s.read for s in reports.values())
        repair = f"`{rescore_command(manifest, run)}`"
        if not lost:
            return RunState(
                rel,
                True,
                keys,
                shards_total=len(keys),
                rollouts=total,
                rollouts_total=total,
                recorded=reports,
                repair=repair,
            )
        return RunState(
            rel,
            False,
            keys,
            shards_total=len(reports),
            rollouts=sum(reports[k].read for k in keys),
            rollouts_total=total,
            missing=f"its manifest lists {len(reports)} shards but {len(lost)} part file(s) are missing "
            f"({_some(lost)})",
            fix=f"rescore it with `pexec score {manifest.input.store} --out {run} --force`",
            recorded=reports,
            repair=repair,
        )
    plan = read_plan(root, rel=rel) if f"{prefix}{PLAN}" in files else None
    markers = read_shard_markers(root, rel=rel, listed=files)
    what = f"{MANIFEST} is not a finished run's manifest" if has_manifest else f"no {MANIFEST} (scoring did not finish)"
    if plan is None:
        keys = tuple(k for k in sorted(markers) if has_parts(k))
        return RunState(
            rel,
            False,
            keys,
            shards_total=None,
            rollouts=sum(markers[k].read for k in keys),
            rollouts_total=None,
            missing=f"{what}, and no {PLAN}: the total it should cover is unknown",
            fix=f"finish it with the `pexec score` command that wrote it (same STORE, `--out {run}`)",
            recorded=markers,
            repair=f"the `pexec score` command that wrote it (same STORE, `--out {run}`)",
        )
    planned = {s.shard: s for s in plan.shards}
    current = {k: m for k, m in markers.items() if k in planned and _matches(m, planned[k], plan)}
    keys = tuple(k for k in planned if k in current and has_parts(k))
    counts = (current[k].read if k in current else planned[k].rows for k in planned)
    return RunState(
        rel,
        False,
        keys,
        shards_total=len(planned),
        rollouts=sum(current[k].read for k in keys),
        rollouts_total=_total(counts),
        input_bytes=_total(planned[k].bytes for k in keys),
        input_bytes_total=plan.bytes,
        missing=f"{what}; {len(keys)} of {len(planned)} shards committed",
        fix=f"finish it with the same `pexec score {plan.store} --out {run}` and the options that started it "
        "(committed shards are reused)",
        recorded=current,
        repair=f"`pexec score {plan.store} --out {run}` with the options that started it",
    )


def _finished(root: RunPrefix, rel: str) -> Manifest | None:
    """The run's manifest when it is a finished run's; None for one cut short or damaged (the run then reads as
    incomplete). A manifest of a layout this pexec does not know is refused (UnknownLayout)."""
    try:
        manifest = read_manifest(root, rel=rel)
    except UnknownLayout:
        raise
    except RunFolderError:
        return None
    return manifest if manifest is not None and manifest.complete else None


def _matches(marker: ShardMarker, shard: PlannedShard, plan: Plan) -> bool:
    """A marker committed for this plan's shard (not left by an earlier input, code version or setting)."""
    same_input = (marker.fingerprint, marker.start, marker.stop) == (shard.fingerprint, shard.start, shard.stop)
    return same_input and (marker.code_version, marker.settings) == (plan.code_version, plan.settings)


def _some(items: list[str]) -> str:
    return some(items, _SHOWN)


def _name(root: RunPrefix, r: RunState) -> str:
    return root.file(r.rel) if r.rel else root.url


def _total(values: Iterable[int | None]) -> int | None:
    """The sum, or None when any value is unknown (None)."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _of(total: int | None) -> str:
    return "an unknown number of" if total is None else f"{total:,}"
