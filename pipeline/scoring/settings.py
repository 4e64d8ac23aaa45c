"""How a scoring job scores (`ScoreSettings`): what `pexec score` options and a job file's top-level keys say,
made the same way by both and by a Python caller, and checked once, here, when it is made.

Each field is named as the job-file key and the `pexec score` parameter that set it (the option is that name with
dashes, `shard_mb` is `--shard-mb`; `spec_dirs`, `options` and `labels` are the repeatable `--spec-dir`,
`--option` and `--label`), so an error names the setting as its user wrote it (pipeline.core.settings).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pipeline.core.errors import EmptyRun, SettingError
from pipeline.core.run_folder import Manifest
from pipeline.core.settings import (
    check_flag,
    check_name,
    check_names,
    check_number,
    check_one_of,
    check_whole,
    is_number,
)
from pipeline.envs import EnvOptions
from pipeline.ingest import IngestOptions
from pipeline.ingest.sharded import RawSource, raw_source
from pipeline.replay.checker import CHECKS, parse_checks
from pipeline.storage.lease import DEFAULT_STALE_AFTER

POLICIES = ("code", "strict")  # written-policy overlays: off, or on where an environment has them
DEFAULT_SHARD_MB = 64.0
DEFAULT_SHARD_BYTES = int(DEFAULT_SHARD_MB * 2**20)
MAX_SHARD_MB = 4096  # the largest target shard size (`--shard-mb`, a job's `shard_mb`)
MAX_NUM_CPUS = 1024  # CPUs of a local Ray (`--num-cpus`)
# A local run with less input than this scores in this process unless told otherwise (`inline=None`): below it,
# starting local Ray costs more than its CPUs save (measured by `pexec bench start`, docs/reference/limits.md).
IN_PROCESS_BELOW_MB = 32
LEASE_STALE_AFTER = (1, 86_400)  # seconds without a heartbeat before another writer takes a run's lease over


def environment_options(spec: str | None, spec_dirs: Sequence[str], policy: str) -> EnvOptions:
    """The environment options of `spec`, `spec_dirs` and `policy` (scoring's and the guard's), checked."""
    check_name("spec", spec)
    check_names("spec_dirs", spec_dirs)
    check_one_of("policy", policy, POLICIES)
    return EnvOptions(spec_dirs=tuple(spec_dirs), spec=spec, policy=policy)


@dataclass(frozen=True)
class ScoreSettings:
    """How a store (or raw logs) is scored into a run: `run_scoring(store, run, ScoreSettings(...))`.

    env: the environment of every rollout (None: each rollout's `benchmark` names its own); spec, spec_dirs,
    policy: what environments are built with (pipeline.envs.EnvOptions); address: the Ray to score on (None: a
    local one, `num_cpus` CPUs); inline: score in this process, without Ray (same output; None: in this process for
    a local run of less than IN_PROCESS_BELOW_MB of input, `placed`); shard_mb: target shard
    size in MiB; force: rescore every shard, even those unchanged since they were committed; lease_stale_after:
    seconds without a heartbeat after which another writer's lease on the run is taken over; checks: which of
    S's schema fit, D and P apply; format, options, labels: how the input is read (a log format read where it lies,
    its `--option` settings, labels added to every rollout; `canonical` with neither: a store read as is);
    storage_options: the fsspec options of the input and the run (they may hold credentials: never shown);
    allow_empty: a run that holds no rollout (every record rejected) is a result, not a failure (`refuse_empty`).
    """

    env: str | None = None
    spec: str | None = None
    spec_dirs: tuple[str, ...] = ()
    policy: str = "code"  # one of POLICIES
    address: str | None = None
    inline: bool | None = False
    shard_mb: float = DEFAULT_SHARD_MB
    num_cpus: int | None = None
    force: bool = False
    lease_stale_after: float = DEFAULT_STALE_AFTER
    checks: tuple[str, ...] = CHECKS
    format: str = "canonical"
    options: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    allow_empty: bool = False

    def __post_init__(self) -> None:
        check_name("env", self.env)
        environment_options(self.spec, self.spec_dirs, self.policy)
        object.__setattr__(self, "spec_dirs", tuple(self.spec_dirs))
        check_name("address", self.address)
        if self.inline is not None:
            check_flag("inline", self.inline)
        if not is_number(self.shard_mb) or self.shard_mb * 2**20 < 1 or self.shard_mb > MAX_SHARD_MB:
            raise SettingError(
                "shard_mb", f"shard_mb takes a size > 0 and at most {MAX_SHARD_MB:,} MiB, got {self.shard_mb!r}"
            )
        if self.num_cpus is not None:
            check_whole("num_cpus", self.num_cpus, 1, MAX_NUM_CPUS)
        check_flag("force", self.force)
        check_flag("allow_empty", self.allow_empty)
        check_number("lease_stale_after", self.lease_stale_after, *LEASE_STALE_AFTER)
        check_names("checks", self.checks)
        try:  # the canonical order: the same checks are the same settings, however they were listed
            object.__setattr__(self, "checks", parse_checks(",".join(self.checks)))
        except ValueError as exc:
            raise SettingError("checks", f"checks: {exc}") from None
        check_name("format", self.format, optional=False)
        for key in ("options", "labels"):
            table = getattr(self, key)
            if not isinstance(table, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in table.items()
            ):
                raise SettingError(key, f"{key} is a table of names to strings, got {table!r}")

    @property
    def env_options(self) -> EnvOptions:
        return EnvOptions(spec_dirs=self.spec_dirs, spec=self.spec, policy=self.policy)

    @property
    def shard_bytes(self) -> int:
        return int(self.shard_mb * 2**20)

    @property
    def executor(self) -> Literal["ray", "inline"]:
        return "inline" if self.inline else "ray"

    def placed(self, input_bytes: int) -> ScoreSettings:
        """These settings with `inline` decided for a job of `input_bytes` of input. Left undecided (None), a run
        is local when nothing names a Ray (no address, no $RAY_ADDRESS, no num_cpus, none running in this
        process): it then scores in this process below IN_PROCESS_BELOW_MB, where Ray's start costs more than
        its CPUs save; any other run scores on Ray."""
        if self.inline is not None:
            return self
        ray = sys.modules.get("ray")
        local = not (self.address or os.environ.get("RAY_ADDRESS") or self.num_cpus or (ray and ray.is_initialized()))
        return replace(self, inline=local and input_bytes < IN_PROCESS_BELOW_MB * 2**20)

    def raw_input(self, sources: Sequence[str]) -> RawSource | None:
        """`sources` read as these settings say: raw logs read by their format's adapter inside the tasks, or None
        for a canonical store read as is (no options, no labels). An unknown format or option fails here."""
        if self.format == "canonical" and not self.options and not self.labels:
            return None
        options = IngestOptions(
            labels=dict(self.labels), extra=dict(self.options), storage_options=self.storage_options
        )
        return raw_source(self.format, sources, options)

    def refuse_empty(self, manifest: Manifest, run: str, opt_in: str = "--allow-empty") -> None:
        """EmptyRun when the scored run holds no rollout and these settings do not allow it."""
        c = manifest.counts
        if c.scored == 0 and not self.allow_empty:
            raise EmptyRun(run, c.read, c.rejected, opt_in)


DEFAULT_SCORING = ScoreSettings()
