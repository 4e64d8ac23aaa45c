"""The commands that write a store of canonical rollouts: synth (synthetic, with known truth) and ingest
(converted from benchmark or production logs)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.table import Table

from pipeline.apps.cli._options import (
    Append,
    EndpointUrl,
    OldStoreFormat,
    OutStore,
    Overwrite,
    RayAddress,
    Seed,
    StorageOption,
    StoreFormat,
    pairs,
    storage,
    store_format,
    write_mode,
)
from pipeline.apps.cli._render import console, out
from pipeline.core.errors import PexecError, SettingError
from pipeline.core.text import literal
from pipeline.scoring.settings import DEFAULT_SHARD_MB, MAX_SHARD_MB
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


def synth(
    spec: Annotated[
        str,
        typer.Argument(
            help="What to build tasks for: the shop spec, tau_telecom (its official tasks, both actors) or "
            "tau_banking_knowledge (a τ source's tasks: --option tau2_source=PATH, tau2_python=PATH)."
        ),
    ],
    out_store: OutStore,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1, max=100_000_000, help="Rollouts to write.")] = 1000,
    tasks: Annotated[
        int,
        typer.Option(
            "--tasks", min=1, max=100_000_000, help="Tasks the rollouts are spread over (at most --rollouts)."
        ),
    ] = 100,
    seed: Seed = 0,
    fmt: StoreFormat = "jsonl",
    old_fmt: OldStoreFormat = None,
    compression: Annotated[str, typer.Option("--compression", help="none, gzip or zstd (JSON Lines)")] = "none",
    per_file: Annotated[int, typer.Option("--per-file", min=1, max=10_000_000, help="Rollouts per file.")] = 50_000,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            help="k=v: tau_banking_knowledge's τ source, tau2_source=PATH (a tau2-bench >= 1.0.1 checkout) and "
            "tau2_python=PATH (its Python, default python3.12).",
        ),
    ] = None,
    overwrite: Overwrite = False,
    append: Append = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Generate a synthetic store with known per-step truth (injected failures, recoveries)."""
    fmt = store_format(fmt, old_fmt, "synth")
    if fmt not in ("jsonl", "parquet") or compression not in ("none", "gzip", "zstd"):
        raise PexecError("--output-format is jsonl or parquet; --compression is none, gzip or zstd")
    mode = write_mode(overwrite, append)
    records = synthesize(spec, rollouts, tasks, seed, pairs(option, "--option"))
    options = storage(endpoint_url, storage_option)
    n = write_store(records, out_store, fmt, per_file, None if compression == "none" else compression, options, mode)
    console.print(f"wrote {n} rollouts over {min(tasks, rollouts)} tasks to {literal(out_store)}")


def ingest(
    fmt: Annotated[str, typer.Argument(help="Source format (docs/reference/log-formats.md: bfcl, tau2, ...).")],
    out_store: OutStore,
    sources: Annotated[
        list[str] | None,
        typer.Argument(
            help="Files, folders or quoted globs (s3://b/otel/day=2*/) to read (none for mlflow, phoenix).",
        ),
    ] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="k=v added to every rollout's labels.")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="k=v setting of the format's adapter.")] = None,
    tracking_uri: Annotated[
        str | None, typer.Option("--tracking-uri", help="mlflow: the tracking server (--option tracking_uri).")
    ] = None,
    experiment: Annotated[
        str | None, typer.Option("--experiment", help="mlflow: the experiment's name (--option experiment).")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="phoenix: the Phoenix server's URL (--option endpoint).")
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", help="phoenix: the project's name (--option project).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="mlflow, phoenix: traces started at or after this UTC time.")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="mlflow, phoenix: traces started before this time.")
    ] = None,
    store_fmt: StoreFormat = "jsonl",
    old_fmt: OldStoreFormat = None,
    overwrite: Overwrite = False,
    append: Append = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
    ray: Annotated[
        bool, typer.Option("--ray", help="Decode the shards in Ray tasks (local Ray, or --address), not here.")
    ] = False,
    address: RayAddress = None,
    shard_mb: Annotated[
        float, typer.Option("--shard-mb", max=MAX_SHARD_MB, help="Target shard size in MiB.")
    ] = DEFAULT_SHARD_MB,
) -> None:
    """Convert benchmark or production logs into canonical rollouts.

    The logs are read shard by shard as `pexec score --format` reads them (files, byte ranges of about
    `--shard-mb` — of a compressed file, of its decompressed bytes —, archive members; OTel spans partitioned by
    conversation first), here or in Ray tasks (`--ray`), and written in source order.
    All or nothing: a part of a log that is not a rollout stops the ingest and nothing is written.
    `--option help` lists the options of FORMAT instead: nothing is read or written."""
    from pipeline.ingest import IngestOptions, accepted_options, checked
    from pipeline.ingest import ingest as run_ingest
    from pipeline.ingest.registry import get_format
    from pipeline.ingest.sharded import raw_source
    from pipeline.scoring.convert import Executor, converted

    if "help" in (option or []):  # each key, its default and its one-line doc, from the format's declared schema
        table = Table("option", "default", "meaning")
        for o in accepted_options(fmt).listed():
            table.add_row(literal(o.key), literal(o.default or ""), literal(o.doc))
        out.print(table)
        return
    store_fmt = store_format(store_fmt, old_fmt, "ingest")
    if shard_mb * 2**20 < 1:
        raise SettingError("shard_mb", f"shard_mb takes a size > 0 and at most {MAX_SHARD_MB:,} MiB, got {shard_mb!r}")
    options = storage(endpoint_url, storage_option)  # for the sources and the output store
    extra = pairs(option, "--option")
    # A trace store's location and window are options of its format: written as flags here, as `--option`
    # (or a job's options) anywhere a format is named. A flag the format does not take is its unknown option.
    flags = {"tracking_uri": tracking_uri, "experiment": experiment, "endpoint": endpoint, "project": project,
             "since": since, "until": until}  # fmt: skip
    extra |= {key: value for key, value in flags.items() if value is not None}
    settings = IngestOptions(labels=pairs(label, "--label"), extra=extra, storage_options=options)
    harness_errors = orphans = orphaned = 0

    def counted(records: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        nonlocal harness_errors, orphans, orphaned
        for record in records:
            harness_errors += record.get("status") == "harness_error"
            found = int((record.get("attributes") or {}).get("orphan_results", 0))
            orphans, orphaned = orphans + found, orphaned + (found > 0)
            yield record

    if not get_format(fmt).reads_files:  # a trace store: read here, through its own client
        records = counted(run_ingest(fmt, [], settings))
    else:
        source = raw_source(fmt, sources or [], settings)
        executor = Executor("ray" if ray or address else "inline", address)
        scratch = f"{out_store.rstrip('/')}/.shuffle-{uuid.uuid4().hex[:8]}"  # a shuffle's partitions, hidden
        shards = converted(source, executor, scratch, int(shard_mb * 2**20))
        records = counted(checked(fmt, shards, source.allow_no_calls, validate=False))
    n = write_store(records, out_store, store_fmt, storage_options=options, mode=write_mode(overwrite, append))
    ok = n - harness_errors
    console.print(f"wrote {n} rollouts to {literal(out_store)}: {ok} ok, {harness_errors} harness error(s)")
    if orphans:
        console.print(
            f"warning: {orphans} tool result(s) in {orphaned} rollout(s) answer no logged call; kept as 'tool' "
            "messages (attribute orphan_results)"
        )
