"""`pexec guard replay LOGS --spec NEW [--against OLD]`: what a guard under a new spec would have refused on
recorded traffic (pipeline.apps.guard.replay), as a summary, a Markdown/HTML page and JSON, with --fail-on
thresholds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import orjson
import typer

from pipeline.apps.cli._options import EndpointUrl, SpecDir, StorageOption, pairs, storage
from pipeline.apps.cli._render import console, json_lines, out
from pipeline.apps.guard.replay import ReplayJSON
from pipeline.core.errors import PexecError
from pipeline.core.model import Rollout
from pipeline.core.records import parse_rollout
from pipeline.core.text import literal

# What --fail-on can name: the report's totals (pipeline.apps.guard.replay.ReplayReport.totals).
FAIL_ON = ("refused", "false_refusals", "caught", "newly_refused", "released")


def replay(
    logs: Annotated[list[str], typer.Argument(help="Recorded traffic: files or folders in --format.")],
    spec: Annotated[str, typer.Option("--spec", help="The new spec (name or folder) the guard would run.")],
    against: Annotated[
        str | None, typer.Option("--against", help="The spec the guard runs today, to compare with.")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="Log format of LOGS (as `pexec ingest`); the MCP guard writes canonical.")
    ] = "canonical",
    option: Annotated[list[str] | None, typer.Option("--option", help="k=v setting of the format's adapter.")] = None,
    out_dir: Annotated[
        str | None, typer.Option("--out", help="Folder to write replay.md, replay.html and replay.json into.")
    ] = None,
    fail_on: Annotated[
        list[str] | None,
        typer.Option("--fail-on", help=f"COUNT>N (or >=, <, <=), COUNT one of {', '.join(FAIL_ON)}: exit 1 when true."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    spec_dir: SpecDir = None,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Replay recorded traffic under a new spec and count the calls its guard would refuse: by tool and rule, in
    rollouts that succeeded anyway, that failed in production, and against the current spec."""
    from pipeline.apps.guard.replay import html_page, markdown, replay_traffic, summary_lines
    from pipeline.ingest import IngestOptions, ingest
    from pipeline.metrics.drift import Threshold, split_threshold

    thresholds = []
    for text in fail_on or []:
        name, op, value = split_threshold(text)
        if name not in FAIL_ON:
            raise PexecError(f"--fail-on {name!r} is not a count of guard replay; one of {', '.join(FAIL_ON)}")
        thresholds.append(Threshold(name, op, value))
    options = storage(endpoint_url, storage_option)
    records = ingest(fmt, logs, IngestOptions(extra=pairs(option, "--option"), storage_options=options))
    report = replay_traffic(_rollouts(records), spec, against, tuple(spec_dir or ()))
    if out_dir is not None:
        _write(out_dir.rstrip("/"), options, markdown(report), html_page(report), report.to_json())
    if as_json:
        json_lines([report.to_json()])
    else:
        for line in summary_lines(report):  # wrapped at the output's width
            out.print(line, markup=False, highlight=False)
        if out_dir is not None:
            console.print(f"written to {literal(out_dir.rstrip('/'))}/replay.html, replay.md and replay.json")
    totals = report.totals()
    crossed = [f"breach {t}: {t.metric} = {totals[t.metric]}" for t in thresholds if t.breached(totals[t.metric])]
    for line in crossed:
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if crossed:
        raise typer.Exit(1)


def _rollouts(records: Iterator[dict[str, Any]]) -> Iterator[Rollout]:
    for record in records:  # ingest has checked each record is a scorable rollout
        yield parse_rollout(record)


def _write(folder: str, options: dict[str, Any] | None, md: str, page: str, data: ReplayJSON) -> None:
    from pipeline.storage.fs import open_for_write

    for name, body in (("replay.md", md.encode()), ("replay.html", page.encode()), ("replay.json", orjson.dumps(data))):
        with open_for_write(f"{folder}/{name}", options) as f:
            f.write(body)
