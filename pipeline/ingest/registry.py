"""Log-format registry: the built-in formats and third-party entry points (pipeline.core.plugins: the one plug-in
pattern, shared with the environments).

A name resolves to a built-in format first, then to an entry point of the `pexec.ingest` group (a package
outside pexec: `[project.entry-points."pexec.ingest"] <name> = "module:object"`, the object a `LogFormat` of that
name). Formats are loaded on first use and kept for the process: listing the names, or an unknown name's error,
imports no adapter; an entry point that cannot be loaded is one line naming its package, and is not tried again.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import IngestError
from pipeline.core.plugins import Registry
from pipeline.ingest.base import LogFormat, OptionSchema

ENTRY_POINT_GROUP = "pexec.ingest"

# The built-in formats, each the `FORMAT` of its module `pipeline/ingest/<name>.py`, in the order they are asked
# whether a document is theirs (`likely_format`): the first that claims it names it. The formats known by a
# top-level key come before the chat formats, which a document with that key and a `messages` list also
# satisfies; bfcl, inspect and canonical claim nothing (they are not read from JSON documents of their own), nor
# do the trace stores mlflow and phoenix (read from a server).
BUILT_IN = ("otel", "tau2", "toolsandbox", "openai", "anthropic", "bfcl", "inspect", "canonical", "mlflow", "phoenix")

FORMATS: Registry[LogFormat] = Registry(
    "log format",
    ENTRY_POINT_GROUP,
    IngestError,
    accepts=lambda obj, name: isinstance(obj, LogFormat) and obj.name == name and isinstance(obj.options, OptionSchema),
    expected="a pipeline.ingest.LogFormat named {name}",
    built_in={name: f"{__package__}.{name}:FORMAT" for name in BUILT_IN},
)


def formats() -> list[str]:
    """The formats this installation can ingest: built-in and entry points."""
    return sorted(FORMATS.names())


def get_format(name: str) -> LogFormat:
    """The format `name`; an unknown name, or an entry point that cannot be loaded, is an IngestError."""
    found = FORMATS.find(name)
    if found is None:
        raise IngestError(f"unknown format {name!r} (available: {', '.join(formats())})")
    return found


_BUILT_IN: dict[str, LogFormat] = {}


def likely_format(doc: Any) -> str | None:
    """The format `doc` (one decoded JSON document, or a conversation record) looks like, when one claims it:
    the built-in formats are asked first, in `BUILT_IN` order, then the entry points by name."""
    for name in BUILT_IN:
        # Asked of every conversation read: each built-in format is looked up once, and only when it is asked.
        built_in = _BUILT_IN.get(name) or _BUILT_IN.setdefault(name, get_format(name))
        if built_in.looks_like(doc):
            return name
    for name in FORMATS.entry_points():
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
