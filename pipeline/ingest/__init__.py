"""Ingest adapters: benchmark and production log formats -> canonical rollout records
(docs/explanation/data-model.md, "Canonical rollout").

One module per format in this package (`pipeline/ingest/<format>.py`), each exposing
`read(sources: Sequence[str], options: IngestOptions) -> Iterator[dict]` that yields canonical records.
Nothing downstream knows the original format. Sources are local paths or fsspec URLs, listed with
`source_files` and opened with `options.storage_options`.

Imports: core, storage, envs.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.core.errors import PexecError
from pipeline.core.records import InvalidRecord, parse_rollout
from pipeline.storage.fs import list_files


class IngestError(PexecError, ValueError):
    """The sources cannot be read in this format; the message names the file and the place."""


@dataclass(frozen=True)
class IngestOptions:
    labels: dict[str, str] = field(default_factory=dict)  # added to every record's labels (`--label k=v`)
    extra: dict[str, str] = field(default_factory=dict)  # format-specific settings (`--option k=v`)
    # the sources' filesystem settings (`--endpoint-url`, `--storage-option k=v`)
    storage_options: dict[str, Any] | None = None


def formats() -> list[str]:
    """The formats this installation can ingest."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


ALLOW_NO_CALLS = "allow_no_calls"


def ingest(fmt: str, sources: Sequence[str], options: IngestOptions | None = None) -> Iterator[dict]:
    """Canonical records from `sources` in format `fmt`; each is checked to be a scorable rollout.

    Rollouts with no tool call at all are held back until one with a call comes: sources that yield rollouts
    but not one call are most likely another format's logs, an error (nothing is written) unless
    `--option allow_no_calls=true` says the logs truly have none."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", fmt) or fmt not in formats():
        raise IngestError(f"unknown format {fmt!r} (available: {', '.join(formats()) or 'none'})")
    options = options or IngestOptions()
    allowed = options.extra.get(ALLOW_NO_CALLS, "false").lower()
    if allowed not in ("true", "false"):
        raise IngestError(f"{fmt}: --option {ALLOW_NO_CALLS} takes true or false, got {allowed!r}")
    extra = {k: v for k, v in options.extra.items() if k != ALLOW_NO_CALLS}
    module = importlib.import_module(f"{__name__}.{fmt}")
    held: list[dict] = []
    calls_seen = allowed == "true"
    for record in module.read(sources, replace(options, extra=extra)):
        try:
            parse_rollout(record)
        except InvalidRecord as exc:  # an adapter bug, not bad input: say which record
            raise IngestError(f"{fmt}: produced an invalid record {record.get('rollout_id')!r}: {exc}") from exc
        if not calls_seen:
            held.append(record)
            calls_seen = any(e.get("type") == "call" for e in record["events"])
            if not calls_seen:
                continue
            yield from held
            held.clear()
            continue
        yield record
    if held:
        raise IngestError(
            f"{fmt}: {len(held)} rollout(s) and not one tool call: are these {fmt} logs? "
            f"(logs that truly have no calls: --option {ALLOW_NO_CALLS}=true)"
        )


def source_files(
    fmt: str, source: str, options: IngestOptions, patterns: Sequence[str], max_depth: int | None = None
) -> list[str]:
    """The URLs of the files to read for `source`: the file itself, or the files of the folder matching
    `patterns` (at most `max_depth` levels down; see `pipeline.storage.fs.list_files`), sorted."""
    found = list_files(source, options.storage_options, patterns=patterns, max_depth=max_depth)
    if found is None:
        raise IngestError(f"{fmt}: {source}: no such file or folder")
    if not found:
        below = " or below" if max_depth is None else "" if max_depth == 1 else f" or {max_depth - 1} level(s) below"
        raise IngestError(f"{fmt}: {source}: no {' or '.join(patterns)} file in this folder{below}")
    return list(found)
