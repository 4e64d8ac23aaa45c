"""Ingest adapters: benchmark and production log formats -> canonical rollout records (DESIGN §4).

One module per format in this package (`pipeline/ingest/<format>.py`), each exposing
`read(sources: Sequence[str], options: IngestOptions) -> Iterator[dict]` that yields canonical records.
Nothing downstream knows the original format.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pipeline.errors import PexecError
from pipeline.records import InvalidRecord, parse_rollout


class IngestError(PexecError, ValueError):
    """The sources cannot be read in this format; the message names the file and the place."""


@dataclass(frozen=True)
class IngestOptions:
    labels: dict[str, str] = field(default_factory=dict)  # added to every record's labels (`--label k=v`)
    extra: dict[str, str] = field(default_factory=dict)  # format-specific settings (`--option k=v`)


def formats() -> list[str]:
    """The formats this installation can ingest."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def ingest(fmt: str, sources: Sequence[str], options: IngestOptions | None = None) -> Iterator[dict]:
    """Canonical records from `sources` in format `fmt`; each is checked to be a scorable rollout."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", fmt) or fmt not in formats():
        raise IngestError(f"unknown format {fmt!r} (available: {', '.join(formats()) or 'none'})")
    module = importlib.import_module(f"{__name__}.{fmt}")
    for record in module.read(sources, options or IngestOptions()):
        try:
            parse_rollout(record)
        except InvalidRecord as exc:  # an adapter bug, not bad input: say which record
            raise IngestError(f"{fmt}: produced an invalid record {record.get('rollout_id')!r}: {exc}") from exc
        yield record
