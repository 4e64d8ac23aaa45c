"""Log-format registry: the built-in formats and third-party entry points.

A name resolves to a built-in format first, then to an entry point of the `pexec.ingest` group (a package
outside pexec: `[project.entry-points."pexec.ingest"] <name> = "module:object"`, the object a `LogFormat`).
Formats are loaded on first use and kept for the process: listing the names, or an unknown name's error,
imports no adapter.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pipeline.ingest.base import IngestError, LogFormat, OptionSchema

ENTRY_POINT_GROUP = "pexec.ingest"

# The built-in formats, each the `FORMAT` of its module `pipeline/ingest/<name>.py`, in the order they are asked
# whether a document is theirs (`likely_format`): the first that claims it names it. The formats known by a
# top-level key come before the chat formats, which a document with that key and a `messages` list also
# satisfies; bfcl, inspect and canonical claim nothing (they are not read from JSON documents of their own), nor
# do the trace stores mlflow and phoenix (read from a server).
BUILT_IN = ("otel", "tau2", "toolsandbox", "openai", "anthropic", "bfcl", "inspect", "canonical", "mlflow", "phoenix")

_LOADED: dict[str, LogFormat | IngestError] = {}  # a name that cannot be loaded is not tried again per document


@cache
def _entry_points() -> dict[str, EntryPoint]:
    """The group's entry points by name (a built-in name shadows one), read once: sniffing asks per document."""
    found: dict[str, EntryPoint] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        if ep.name not in BUILT_IN:
            found.setdefault(ep.name, ep)
    return found


def formats() -> list[str]:
    """The formats this installation can ingest: built-in and entry points."""
    return sorted([*BUILT_IN, *_entry_points()])


def get_format(name: str) -> LogFormat:
    """The format `name`; an unknown name, or an entry point that cannot be loaded, is an IngestError."""
    if name not in _LOADED:
        try:
            _LOADED[name] = _load(name)
        except IngestError as exc:
            _LOADED[name] = exc
    found = _LOADED[name]
    if isinstance(found, IngestError):
        raise found
    return found


def _load(name: str) -> LogFormat:
    if name in BUILT_IN:
        return importlib.import_module(f"{__package__}.{name}").FORMAT
    ep = _entry_points().get(name)
    if ep is None:
        raise IngestError(f"unknown format {name!r} (available: {', '.join(formats())})")
    try:
        loaded = ep.load()
    except Exception as exc:  # whatever the package's import raises: the user needs its name, not a traceback
        raise IngestError(f"log format {name!r}: the entry point {ep.value} of {_package(ep)} fails: {exc}") from exc
    if not isinstance(loaded, LogFormat) or not isinstance(loaded.options, OptionSchema) or loaded.name != name:
        raise IngestError(
            f"log format {name!r}: the entry point {ep.value} of {_package(ep)} is not a "
            f"pipeline.ingest.LogFormat named {name!r} (with name, options, looks_like, read)"
        )
    return loaded


def _package(ep: EntryPoint) -> str:
    return f"package {ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unnamed package"


def likely_format(doc: Any) -> str | None:
    """The format `doc` (one decoded JSON document, or a conversation record) looks like, when one claims it:
    the built-in formats are asked first, in `BUILT_IN` order, then the entry points by name."""
    for name in BUILT_IN:
        if get_format(name).looks_like(doc):
            return name
    for name in _entry_points():
        # A hint is not worth failing the read of another format: an outside format that cannot be loaded, or
        # whose looks_like raises, is passed over here and reported when it is named (`pexec ingest <name>`).
        try:
            if get_format(name).looks_like(doc):
                return name
        except Exception:
            continue
    return None


def mismatch(fmt: str, doc: Any) -> str | None:
    """` (it looks like X logs: pexec ingest X)` when `doc` clearly belongs to another format X, else None."""
    other = likely_format(doc)
    return f" (it looks like {other} logs: pexec ingest {other})" if other not in (None, fmt) else None
