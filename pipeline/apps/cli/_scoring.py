"""`pexec score` and what it shares with `pexec run`: the live progress of a scoring job, its closing summary,
and a scheduler's SIGTERM unwinding like Ctrl-C."""

from __future__ import annotations

import signal
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from pipeline.apps.cli._options import (
    AllowEmpty,
    EndpointUrl,
    Force,
    Policy,
    RayAddress,
    SpecDir,
    StorageOption,
    pairs,
    storage,
)
from pipeline.apps.cli._render import console
from pipeline.core.run_folder import Manifest, ShardMarker
from pipeline.core.text import literal
from pipeline.replay.checker import CHECKS
from pipeline.scoring.driver import ShardPlan, run_scoring
from pipeline.scoring.settings import (
    DEFAULT_SHARD_MB,
    IN_PROCESS_BELOW_MB,
    LEASE_STALE_AFTER,
    MAX_NUM_CPUS,
    MAX_SHARD_MB,
    ScoreSettings,
)
from pipeline.storage.lease import DEFAULT_STALE_AFTER


def score(
    store: Annotated[
        list[str], typer.Argument(help="Input: a store, or with --format raw logs (files or folders); local or fsspec.")
    ],
    output: Annotated[str, typer.Option("--out", help="Run folder to write (steps/, rollouts/, rejects/).")],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment for every rollout (default: each rollout's benchmark).")
    ] = None,
    spec: Annotated[
        str | None, typer.Option("--spec", help="Spec giving `observed` its schemas and grounding.")
    ] = None,
    spec_dirs: SpecDir = None,
    address: RayAddress = None,
    policy: Policy = "code",
    shard_mb: Annotated[
        float, typer.Option("--shard-mb", max=MAX_SHARD_MB, help="Target shard size in MiB.")
    ] = DEFAULT_SHARD_MB,
    num_cpus: Annotated[
        int | None, typer.Option("--num-cpus", min=1, max=MAX_NUM_CPUS, help="CPUs for local Ray.")
    ] = None,
    inline: Annotated[
        bool | None,
        typer.Option(
            "--inline",
            help=f"Score in this process, without Ray (the default for a local run of less than "
            f"{IN_PROCESS_BELOW_MB} MiB of input; --num-cpus, --address or $RAY_ADDRESS: Ray).",
        ),
    ] = None,
    force: Force = False,
    lease_stale_after: Annotated[
        float,
        typer.Option(
            "--lease-stale-after",
            min=LEASE_STALE_AFTER[0],
            max=LEASE_STALE_AFTER[1],
            help="Seconds without a heartbeat after which another writer's lease on the run is taken over.",
        ),
    ] = DEFAULT_STALE_AFTER,
    endpoint_url: EndpointUrl = None,
    storage_options: StorageOption = None,
    checks: Annotated[
        str,
        typer.Option("--checks", help="Checks that apply, a comma-separated subset of schema,dependency,precondition."),
    ] = ",".join(CHECKS),
    format: Annotated[
        str,
        typer.Option(
            "--format", help="Log format of the input, read where it lies inside the tasks (`pexec ingest` formats)."
        ),
    ] = "canonical",
    options: Annotated[list[str] | None, typer.Option("--option", help="k=v setting of the format's reader.")] = None,
    labels: Annotated[list[str] | None, typer.Option("--label", help="k=v added to every rollout's labels.")] = None,
    allow_empty: AllowEmpty = False,
) -> None:
    """Replay every rollout and write per-step flags, per-rollout summaries, rejects and the manifest.

    With `--format FMT` the input is raw logs in that format, decoded inside the scoring tasks (files, byte
    ranges, archive members; a format whose rollouts span files is shuffled by key first)."""
    # Each parameter is named as the ScoreSettings field (and job-file key) it sets: a job sets the same things.
    settings = ScoreSettings(
        env=env,
        spec=spec,
        spec_dirs=tuple(spec_dirs or ()),
        policy=policy,
        address=address,
        inline=inline,
        shard_mb=shard_mb,
        num_cpus=num_cpus,
        force=force,
        lease_stale_after=lease_stale_after,
        checks=tuple(c.strip() for c in checks.split(",") if c.strip()),
        format=format,
        options=pairs(options, "--option"),
        labels=pairs(labels, "--label"),
        storage_options=storage(endpoint_url, storage_options),
        allow_empty=allow_empty,
    )
    unwind_on_sigterm()
    with ScoreProgress(settings) as progress:
        manifest = run_scoring(store, output, settings, on_plan=progress.on_plan, on_shard=progress.on_shard)
    summary(manifest, output)
    settings.refuse_empty(manifest, output)


_SIGNALLED: list[int] = []  # the stopping signals received, in order


def unwind_on_sigterm() -> None:
    """A scheduler's SIGTERM (a cron or pod timeout) unwinds like Ctrl-C, so the run's lease is released. Both are
    also remembered (`stop_if_signalled`)."""

    def leave(signum: int, frame: object) -> None:
        _SIGNALLED.append(signum)
        raise SystemExit(128 + signum)

    def interrupt(signum: int, frame: object) -> None:
        _SIGNALLED.append(signum)
        raise KeyboardInterrupt

    _SIGNALLED.clear()  # one that came before this command (run in-process, as tests do) is not for it
    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, interrupt)


def stop_if_signalled() -> None:
    """Stop now if a stopping signal came. A handler's exception is lost when the signal lands while a finaliser runs
    (a `__del__`, a weakref callback: Python prints "Exception ignored" and carries on), and the job would then
    score to the end and commit; the progress callbacks, run in the main thread between shards, stop it instead."""
    if _SIGNALLED:
        if _SIGNALLED[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + _SIGNALLED[0])


class ScoreProgress:
    """The driver's live view of a scoring job: shards, rollouts, rollouts/s, rejects, ETA. A context manager: the
    view starts with the plan, so that a job refused before it (a missing store, an unknown format) prints its error
    alone. Given the job's settings, it says when a run left to decide scores in this process."""

    def __init__(self, settings: ScoreSettings | None = None) -> None:
        self.settings = settings
        self.bar = Progress(
            TextColumn("[bold]scoring"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("shards"),
            TextColumn(
                "{task.fields[rollouts]:,} rollouts · {task.fields[rate]:,.0f}/s · {task.fields[rejects]} rejects"
            ),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.rollouts = self.rejects = 0
        self.task: Any = None
        self.seen: dict[str, ShardMarker] = {}  # a shard holding a later copy of a duplicated id reports twice

    def __enter__(self) -> ScoreProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar.live.is_started:  # stopping a view never started would print an empty line
            self.bar.stop()

    def on_plan(self, p: ShardPlan) -> None:
        self.bar.start()
        console.print(
            f"plan: {p.files} file(s), {p.total_bytes / 2**20:,.1f} MiB -> {len(p.shards)} shard(s)"
            + (f", {p.reusable} unchanged since they were scored (reused)" if p.reusable else "")
            + (f"; ignored {len(p.ignored)} non-data file(s)" if p.ignored else "")
        )
        s = self.settings  # left to decide, with shards to score, and placed in this process: one line at 80 columns
        if s is not None and s.inline is None and p.reusable < len(p.shards) and s.placed(p.total_bytes).inline:
            console.print(f"in-process: under {IN_PROCESS_BELOW_MB} MiB, Ray's start costs more (--num-cpus N: Ray)")
        self.task = self.bar.add_task("score", total=len(p.shards), rollouts=0, rate=0.0, rejects=0)

    def on_shard(self, r: ShardMarker) -> None:
        stop_if_signalled()
        before = self.seen.get(r.shard)
        self.seen[r.shard] = r
        self.rollouts += r.scored - (before.scored if before else 0)
        self.rejects += r.rejected - (before.rejected if before else 0)
        elapsed = self.bar.tasks[self.task].elapsed or 1e-9
        self.bar.update(
            self.task,
            advance=0 if before else 1,
            rollouts=self.rollouts,
            rejects=self.rejects,
            rate=self.rollouts / elapsed,
        )


def summary(manifest: Manifest, run: str) -> None:
    """What a scoring job did, on one line, and how to see its rejects when there are any."""
    c = manifest.counts
    console.print(
        f"read {c.read:,} · scored {c.scored:,} · rejected {c.rejected:,} · steps {c.steps:,} "
        f"· {c.shards_reused} of {c.shards} shard(s) reused · {manifest.seconds:.1f}s -> {literal(run)}"
    )
    if c.rejected and c.scored:  # none scored: the error that follows says where to look
        query = "SELECT reason, source, location FROM rejects"
        hint = f"{c.rejected} record(s) rejected; to see them: pexec sql {literal(run)} '{query}'"
        console.print(Text(hint, "yellow"))
