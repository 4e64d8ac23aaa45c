"""`pexec`: a thin command line over the Python API (pipeline.*)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pipeline.aggregate import BootstrapSettings, QueryRefused, compute_metrics, sql, write_metrics
from pipeline.distributed import DEFAULT_SHARD_BYTES, JobFailed, ShardPlan, run_scoring
from pipeline.envs import EnvError, EnvOptions
from pipeline.score import ShardReport
from pipeline.specs import SpecError
from pipeline.store import StoreError
from pipeline.synth import synthesize, write_store

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 150)  # logs and pipes get full rows


def _fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


@app.command()
def synth(
    spec: Annotated[str, typer.Argument(help="Spec to build tasks for (shipped: shop).")],
    out_store: Annotated[str, typer.Option("--out", help="Store to write (folder or fsspec URL).")],
    rollouts: Annotated[int, typer.Option("--rollouts", min=1)] = 1000,
    tasks: Annotated[int, typer.Option("--tasks", min=1)] = 100,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet")] = "jsonl",
    compression: Annotated[str, typer.Option("--compression", help="none, gzip or zstd (JSON Lines)")] = "none",
    per_file: Annotated[int, typer.Option("--per-file", min=1, help="Rollouts per file.")] = 50_000,
) -> None:
    """Generate a synthetic store with known per-step truth (injected failures, recoveries)."""
    if fmt not in ("jsonl", "parquet") or compression not in ("none", "gzip", "zstd"):
        raise _fail("--format is jsonl or parquet; --compression is none, gzip or zstd")
    try:
        records = synthesize(spec, rollouts, tasks, seed)
        n = write_store(records, out_store, fmt, per_file, None if compression == "none" else compression)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"wrote {n} rollouts over {min(tasks, rollouts)} tasks to {out_store}")


@app.command()
def ingest(
    fmt: Annotated[str, typer.Argument(help="Source format (see README: bfcl, tau2, ...).")],
    sources: Annotated[list[str], typer.Argument(help="Files or folders to read.")],
    out_store: Annotated[str, typer.Option("--out", help="Store to write (folder or fsspec URL).")],
    label: Annotated[list[str] | None, typer.Option("--label", help="k=v added to every rollout's labels.")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="k=v setting of the format's adapter.")] = None,
    store_fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet")] = "jsonl",
) -> None:
    """Convert benchmark or production logs into canonical rollouts."""
    from pipeline.ingest import IngestError, IngestOptions
    from pipeline.ingest import ingest as run_ingest

    try:
        options = IngestOptions(labels=_pairs(label, "--label"), extra=_pairs(option, "--option"))
        n = write_store(run_ingest(fmt, sources, options), out_store, store_fmt)
    except (IngestError, StoreError, OSError) as exc:
        raise _fail(str(exc)) from exc
    console.print(f"wrote {n} rollouts to {out_store}")


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"{flag} takes key=value, got {item!r}")
        pairs[key] = value
    return pairs


@app.command()
def score(
    store: Annotated[str, typer.Argument(help="Input store: a file or folder, local path or fsspec URL.")],
    run: Annotated[str, typer.Option("--out", help="Run folder to write (steps/, rollouts/, rejects/).")],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment for every rollout (default: each rollout's benchmark).")
    ] = None,
    spec: Annotated[
        str | None, typer.Option("--spec", help="Spec giving `observed` its schemas and grounding.")
    ] = None,
    spec_dir: Annotated[list[str] | None, typer.Option("--spec-dir", help="Extra folder to search for specs.")] = None,
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (default: local Ray).")] = None,
    policy: Annotated[str, typer.Option("--policy", help="code or strict (written-policy overlays)")] = "code",
    shard_mb: Annotated[float, typer.Option("--shard-mb", help="Target shard size in MiB.")] = DEFAULT_SHARD_BYTES
    / 2**20,
    num_cpus: Annotated[int | None, typer.Option("--num-cpus", help="CPUs for local Ray.")] = None,
    inline: Annotated[bool, typer.Option("--inline", help="Score in this process, without Ray.")] = False,
) -> None:
    """Replay every rollout and write per-step flags, per-rollout summaries, rejects and the manifest."""
    if policy not in ("code", "strict"):
        raise _fail("--policy is code or strict")
    options = EnvOptions(spec_dirs=tuple(spec_dir or ()), spec=spec, policy=policy)
    progress = Progress(
        TextColumn("[bold]scoring"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("shards"),
        TextColumn("{task.fields[rollouts]:,} rollouts · {task.fields[rate]:,.0f}/s · {task.fields[rejects]} rejects"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
    state: dict[str, Any] = {"rollouts": 0, "rejects": 0, "task": None}

    def on_plan(p: ShardPlan) -> None:
        console.print(
            f"plan: {p.files} file(s), {p.total_bytes / 2**20:,.1f} MiB -> {len(p.shards)} shard(s)"
            + (f"; ignored {len(p.ignored)} non-data file(s)" if p.ignored else "")
        )
        state["task"] = progress.add_task("score", total=len(p.shards), rollouts=0, rate=0.0, rejects=0)

    def on_shard(r: ShardReport) -> None:
        state["rollouts"] += r.scored
        state["rejects"] += r.rejected
        task = progress.tasks[state["task"]]
        elapsed = task.elapsed or 1e-9
        progress.update(
            state["task"],
            advance=1,
            rollouts=state["rollouts"],
            rejects=state["rejects"],
            rate=state["rollouts"] / elapsed,
        )

    try:
        with progress:
            manifest = run_scoring(
                store,
                run,
                env=env,
                options=options,
                address=address,
                executor="inline" if inline else "ray",
                shard_bytes=int(shard_mb * 2**20),
                num_cpus=num_cpus,
                on_plan=on_plan,
                on_shard=on_shard,
            )
    except (StoreError, SpecError, EnvError, JobFailed) as exc:
        raise _fail(str(exc)) from exc
    c = manifest["counts"]
    console.print(
        f"read {c['read']:,} · scored {c['scored']:,} · rejected {c['rejected']:,} · steps {c['steps']:,} "
        f"in {manifest['seconds']:.1f}s -> {run}"
    )
    if c["rejected"]:
        console.print(f"[yellow]{c['rejected']} record(s) rejected: see {run.rstrip('/')}/rejects/")


@app.command()
def metrics(
    run: Annotated[str, typer.Argument(help="A scored run folder.")],
    by: Annotated[
        str | None, typer.Option("--by", help="Label columns that define a condition, e.g. model,method.")
    ] = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", min=1, help="Bootstrap replicates B.")] = 1000,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    method: Annotated[str, typer.Option("--method", help="multinomial (task resampling) or poisson")] = "multinomial",
    max_k: Annotated[
        int | None, typer.Option("--max-k", help="Largest k for PEC(k) (default: max T, at most 20).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cohort.")] = False,
) -> None:
    """Success, TER, AUC-PEC, RR and PEC(k) per cohort with 95% task-level bootstrap intervals."""
    if method not in ("multinomial", "poisson"):
        raise _fail("--method is multinomial or poisson")
    columns = [c.strip() for c in by.split(",") if c.strip()] if by else None
    try:
        cohorts = compute_metrics(run, columns, BootstrapSettings(B=bootstrap, seed=seed, method=method), max_k)
        write_metrics(run, cohorts)
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        for cohort in cohorts:
            sys.stdout.write(orjson.dumps(cohort).decode() + "\n")
        return
    out.print(metrics_table(cohorts, columns))
    if cohorts:
        b = cohorts[0]["bootstrap"]
        out.print(
            f"95% intervals: {b['method']} task-level bootstrap, B={b['B']}, seed={b['seed']}, "
            f"DuckDB {b['duckdb_version']}; written to {run.rstrip('/')}/metrics/"
        )


def metrics_table(cohorts: list[dict], by: list[str] | None) -> Table:
    labels = by or sorted({k for c in cohorts for k in c if isinstance(c[k], str)} - {"benchmark"})
    table = Table(title="Prefix executability: value and 95% interval")
    for name in ["benchmark", "condition", "N", "tasks", "success", "TER", "AUC-PEC", "RR (n)", "PEC@1", "PEC@3"]:
        table.add_column(name, justify="left" if name in ("benchmark", "condition") else "right")
    for c in cohorts:
        pec = {p["k"]: p for p in c["pec"]}
        table.add_row(
            str(c["benchmark"]),
            " · ".join(str(c.get(k)) for k in labels) or "all",
            str(c["n"]),
            str(c["n_tasks"]),
            *(_ci(c[m]) for m in ("success", "ter", "auc_pec")),
            _ci(c["rr"]) + f"\n({c['rr']['eligible']})",
            *(_ci(pec[k]) if k in pec else "–" for k in (1, 3)),
        )
    return table


def _ci(m: dict) -> str:
    if m.get("value") is None:
        return "–"
    return f"{m['value']:.3f}\n{m['lo']:.3f}–{m['hi']:.3f}"


@app.command("sql")
def sql_command(
    run: Annotated[str, typer.Argument(help="A scored run folder.")],
    query: Annotated[str, typer.Argument(help="A read-only query over the views steps, rollouts, metrics.")],
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
) -> None:
    """Run a read-only SQL query (DuckDB) over the run's tables."""
    try:
        result = sql(run, query)
    except QueryRefused as exc:
        raise _fail(f"refused: {exc}") from exc
    except Exception as exc:  # DuckDB's own errors (syntax, unknown column) are the user's to read
        raise _fail(str(exc)) from exc
    rows = result.to_pylist()
    if fmt == "json":
        for row in rows:
            sys.stdout.write(orjson.dumps(row, default=str).decode() + "\n")
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(result, sys.stdout.buffer)
    else:
        table = Table()
        for name in result.column_names:
            table.add_column(name)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row.values()))
        out.print(table)


@app.command()
def bench(
    what: Annotated[str, typer.Argument(help="replay or metrics")] = "replay",
    rollouts: Annotated[
        int | None, typer.Option("--rollouts", help="Store size (default: 220k replay, 1M metrics).")
    ] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Where to put the generated data.")] = None,
) -> None:
    """Benchmarks: replay throughput through Ray vs a naive baseline, or the DuckDB bootstrap stage."""
    if what == "replay":
        from pipeline.benchmarks.replay import bench_replay

        bench_replay(n_rollouts=rollouts or 220_000, workdir=workdir)
    elif what == "metrics":
        from pipeline.benchmarks.metrics import bench_metrics

        bench_metrics(n_rollouts=rollouts or 1_000_000, workdir=workdir)
    else:
        raise _fail("bench takes replay or metrics")


if __name__ == "__main__":
    app()
