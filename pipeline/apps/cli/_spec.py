"""`pexec spec draft LOGS --format FMT --out DIR`: a draft spec folder mined from logs (pipeline.apps.drafting)."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.apps.cli._options import EndpointUrl, RayAddress, StorageOption, pairs, storage
from pipeline.apps.cli._render import console
from pipeline.core.text import literal
from pipeline.scoring.settings import DEFAULT_SHARD_MB, MAX_NUM_CPUS, MAX_SHARD_MB, ScoreSettings

spec_app = typer.Typer(no_args_is_help=True, help="Specs: draft one from logs to review.")


def draft(
    logs: Annotated[list[str], typer.Argument(help="Logs: files or folders in --format (or a canonical store).")],
    out: Annotated[str, typer.Option("--out", help="Folder to write the draft spec into (new or empty).")],
    format: Annotated[
        str, typer.Option("--format", help="Log format of LOGS (as `pexec score --format`).")
    ] = "canonical",
    options: Annotated[list[str] | None, typer.Option("--option", help="k=v setting of the format's reader.")] = None,
    min_share: Annotated[
        float,
        typer.Option("--min-share", min=0.0, max=1.0, help="Grounded: share of calls whose value occurred earlier."),
    ] = 0.9,
    min_calls: Annotated[
        int, typer.Option("--min-calls", min=1, help="Grounded: values a parameter needs before it is proposed.")
    ] = 20,
    free_text: Annotated[
        bool, typer.Option("--free-text", help="Also propose parameters whose values are mostly not identifiers.")
    ] = False,
    min_reuse: Annotated[
        float,
        typer.Option(
            "--min-reuse",
            min=0.0,
            help="Grounded, for values only the messages carried (the user's words): tasks each value is used by.",
        ),
    ] = 3.0,
    rule_support: Annotated[
        int, typer.Option("--rule-support", min=1, help="Rule candidates: failing calls the condition held for.")
    ] = 3,
    rule_precision: Annotated[
        float,
        typer.Option("--rule-precision", min=0.0, max=1.0, help="Rule candidates: share of its calls that failed."),
    ] = 0.8,
    shard_mb: Annotated[float, typer.Option("--shard-mb", max=MAX_SHARD_MB, help="Target shard size in MiB.")] = (
        DEFAULT_SHARD_MB
    ),
    inline: Annotated[bool, typer.Option("--inline", help="Read in this process, without Ray.")] = False,
    address: RayAddress = None,
    num_cpus: Annotated[
        int | None, typer.Option("--num-cpus", min=1, max=MAX_NUM_CPUS, help="CPUs for local Ray.")
    ] = None,
    endpoint_url: EndpointUrl = None,
    storage_options: StorageOption = None,
) -> None:
    """Mine a draft spec from logs: the tool definitions they recorded (tools.json), grounded parameters proposed
    from evidence and candidate `observed` rules from logged errors, commented out (spec.toml). A file to review:
    nothing mined is enabled without a person."""
    from pipeline.apps.drafting import DraftSettings
    from pipeline.apps.drafting import draft as run_draft

    reading = ScoreSettings(
        format=format,
        options=pairs(options, "--option"),
        shard_mb=shard_mb,
        storage_options=storage(endpoint_url, storage_options),
    )
    thresholds = DraftSettings(min_share, min_calls, free_text, rule_support, rule_precision, min_reuse)
    made = run_draft(logs, out, reading, thresholds, inline=inline, address=address, num_cpus=num_cpus)
    ev = made.evidence
    console.print(
        f"{made.read} records read ({made.rejected} rejected) in {made.shards} shards: {ev.rollouts} rollouts, "
        f"{ev.calls} calls of {len(ev.tools)} tools; largest reader peak {made.worker_peak_mib:,.0f} MiB"
    )
    for tool, paths in made.proposed.items():
        if paths:
            console.print(f"  {literal(tool)}: grounded {literal(', '.join(paths))}")
    console.print(f"{made.rule_candidates} rule candidate(s), commented out")
    console.print(f"draft written to {literal(str(made.out))}/ (spec.toml, tools.json, initial_state.json): review it")
