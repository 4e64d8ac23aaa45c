"""The log-format protocol every ingest adapter implements, its options schema, and what every adapter uses:
the settings of one ingest (`IngestOptions`), its error (`IngestError`) and the listing of source files.

`pipeline.ingest.ingest` only talks to this protocol, so adding a format never touches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pipeline.core.errors import PexecError
from pipeline.storage.fs import list_files


class IngestError(PexecError, ValueError):
    """The sources cannot be read in this format; the message names the file and the place."""


@dataclass(frozen=True)
class IngestOptions:
    labels: dict[str, str] = field(default_factory=dict)  # added to every record's labels (`--label k=v`)
    extra: dict[str, str] = field(default_factory=dict)  # format-specific settings (`--option k=v`)
    # the sources' filesystem settings (`--endpoint-url`, `--storage-option k=v`)
    storage_options: dict[str, Any] | None = None


@dataclass(frozen=True)
class Option:
    """One `--option KEY=VALUE` a format accepts."""

    key: str
    doc: str  # one line: what the value is and what happens when the option is not given
    default: str | None = None  # the value `read` gets when the option is not given; None: left out


FIELD_PREFIXES = ("label.", "attr.")  # `label.NAME=PATH`, `attr.NAME=PATH`: one key per name the user picks
FIELD_OPTIONS = (
    Option("label.NAME", "condition label NAME from the field at dotted PATH"),
    Option("attr.NAME", "per-rollout attribute NAME from the field at dotted PATH"),
)


@dataclass(frozen=True)
class OptionSchema:
    """The `--option` keys a format accepts; `fields`: also `label.NAME=PATH` and `attr.NAME=PATH`."""

    options: tuple[Option, ...] = ()
    fields: bool = False

    def listed(self) -> tuple[Option, ...]:
        """Every option as the user writes it, in the order declared (`label.NAME`, `attr.NAME` last)."""
        return self.options + (FIELD_OPTIONS if self.fields else ())

    def unknown(self, given: Iterable[str]) -> list[str]:
        """The keys of `given` this schema does not accept, sorted."""
        keys = {o.key for o in self.options}
        return sorted(k for k in given if k not in keys and not (self.fields and k.startswith(FIELD_PREFIXES)))

    def known(self) -> list[str]:
        """The accepted keys for an error message: sorted, then `label.NAME`, `attr.NAME`."""
        return sorted(o.key for o in self.options) + [o.key for o in FIELD_OPTIONS if self.fields]

    def defaults(self) -> dict[str, str]:
        return {o.key: o.default for o in self.options if o.default is not None}


@runtime_checkable
class LogFormat(Protocol):
    """A log format `pexec ingest <name>` reads.

    `ingest` checks the `--option` keys against `options` before `read` runs (an unknown key is an error),
    and gives `read` the keys the user gave plus every declared default (`Option.default`); `allow_no_calls`
    is the ingest's own, never passed on. `read` yields canonical records (`pipeline/core/records.py`); an
    input it cannot read raises `IngestError` naming the file and the place.
    """

    name: str
    options: OptionSchema

    def looks_like(self, doc: Any) -> bool:
        """Whether `doc` (one decoded JSON document, or a conversation record) is clearly in this format:
        another format's reader given it names this one (`pexec ingest <name>`). False when unsure."""

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict]:
        """Canonical records from `sources` (local paths or fsspec URLs opened with `options.storage_options`)."""


def never(doc: Any) -> bool:
    """`looks_like` of a format that claims no document (it is not read from JSON documents)."""
    return False


@dataclass(frozen=True)
class Format:
    """A `LogFormat` made of functions: how the built-in formats declare themselves."""

    name: str
    read: Callable[[Sequence[str], IngestOptions], Iterator[dict]]
    options: OptionSchema = OptionSchema()
    looks_like: Callable[[Any], bool] = never
    # False for a format read from a server (a trace store), not from files: its `read` gets no sources.
    reads_files: bool = True


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
