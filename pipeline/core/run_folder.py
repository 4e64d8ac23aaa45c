"""The run folder's JSON, typed: the plan written before the first shard is scored, one marker per committed shard,
the manifest written last (docs/reference/run-folder.md, whose tables of fields are generated from these types).

These files are the whole contract between the half of pexec that scores (pipeline.scoring writes them, through
pipeline.storage.run) and the half that reads (pipeline.metrics.completeness decides from them what a reader may
read). Each is a frozen msgspec Struct: decoding a file validates it against its type in the same pass as the
JSON is parsed (faster than parsing it into dicts alone), and a file that does not fit is one line saying where.
A dataclass would need a hand-written validator; pydantic validates too, at about three times msgspec's cost
(`pexec`'s own measurement: 10,000 shard markers decode in 39 ms with msgspec, 57 ms as plain orjson dicts, 135 ms
with pydantic).

Every file carries `schema_version`. A file without it was written before the version was recorded, in the
layout of version 1. Layout 2 adds each part's row count and SHA-256 digest to its shard's marker (and so to the
manifest, which lists the markers); this pexec writes layout 2 and still reads layout 1, whose parts it cannot
verify (`pexec verify` says so, and a rerun scores such shards again to record them). A version this pexec does
not know (a newer pexec wrote the folder) is refused in one line, never guessed at: its fields may mean something
else.

Imports: core.errors.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec
import orjson
from msgspec import Meta

from pipeline.core.errors import RunFolderError, UnknownLayout

SCHEMA_VERSION = 2  # the layout this pexec writes
READ_VERSIONS = (1, 2)  # the layouts it reads: layout 1 has no part digests
DIGEST = "sha256"  # of a part's bytes: hashlib's SHA-256 runs on the CPU's SHA instructions, faster than BLAKE2b


_VERSION = Annotated[
    int,
    Meta(
        description="the run folder layout: 2 records each part's rows and digest; absent in folders written before "
        "it was recorded (they are layout 1)"
    ),
]


class _File(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A run folder record: immutable, keyword-built, and strict about fields when decoded. Subclasses inherit the
    configuration; they repeat `frozen=True` only so that a type checker (which reads the class statement, not the
    metaclass) knows they are frozen too."""


# --- the plan -------------------------------------------------------------------------------------------------


class PlannedShard(_File, frozen=True):
    """One shard the run should score."""

    shard: Annotated[
        str, Meta(description="the shard's key: a hash of its file's URL and range, the name of its parts and marker")
    ]
    source: Annotated[str, Meta(description="the input file's URL")]
    fingerprint: Annotated[str, Meta(description="the input file's size and content version when planned")]
    start: Annotated[
        int,
        Meta(description="byte offset (JSON Lines), first row group (Parquet), first partition or item; 0: whole file"),
    ]
    stop: Annotated[int | None, Meta(description="exclusive end of the range; null: to the end of the file")]
    rows: Annotated[
        int | None, Meta(description="rollouts in the shard when planning can count them (Parquet); else null")
    ]
    bytes: Annotated[
        int | None, Meta(description="input bytes the shard spans; null for a range of Parquet row groups")
    ]


class Plan(_File, frozen=True):
    """The plan: what a (re)run will cover, written before its first shard is scored, so that a reader of an
    unfinished run can state its coverage."""

    run_id: Annotated[str, Meta(description="the run's id")]
    store: Annotated[str, Meta(description="the input as named on the command line")]
    code_version: Annotated[str, Meta(description="the scoring core's code version")]
    settings: Annotated[
        str, Meta(description="what besides input and versions decides a shard's output (run id, env, options, checks)")
    ]
    started_at: Annotated[str, Meta(description="ISO 8601, UTC")]
    bytes: Annotated[int, Meta(description="input bytes in all")]
    shards: Annotated[tuple[PlannedShard, ...], Meta(description="every planned shard")]
    schema_version: _VERSION = SCHEMA_VERSION


# --- a shard's marker -----------------------------------------------------------------------------------------


class ShardMarker(_File, frozen=True):
    """A shard's marker: the committed shard's report, written after its three parts (its commit), and what a
    rerun may reuse. The manifest lists every shard's marker."""

    shard: Annotated[str, Meta(description="the shard's key")]
    source: Annotated[str, Meta(description="the input file's URL")]
    start: Annotated[int, Meta(description="start of the shard's range")]
    stop: Annotated[int | None, Meta(description="end of the shard's range; null: to the end of the file")]
    fingerprint: Annotated[str, Meta(description="the input file's fingerprint when scored")]
    read: Annotated[int, Meta(description="records read: scored + rejected, checked per shard")] = 0
    scored: Annotated[int, Meta(description="rollouts scored")] = 0
    rejected: Annotated[int, Meta(description="records rejected (rows of its rejects part)")] = 0
    steps: Annotated[int, Meta(description="calls replayed")] = 0
    seconds: Annotated[float, Meta(description="wall time of the shard's task")] = 0.0
    peak_rss_mib: Annotated[
        float,
        Meta(
            description="peak resident memory (VmHWM, MiB) of the process that scored it: on Ray the task's own "
            "(its worker's peak restarted as the task began); scored in-process, the process's peak so far"
        ),
    ] = 0.0
    environments: Annotated[
        dict[str, str | None],
        Meta(
            description="name -> its version and its family's code version (`<version>; code <family>@<hash>`); "
            "null: the name did not resolve (a rerun rescores the shard once it does)",
        ),
    ] = {}
    code_version: Annotated[str, Meta(description="the scoring core's code version")] = ""
    settings: Annotated[str, Meta(description="the settings identity of the run that scored it (as the plan's)")] = ""
    reused: Annotated[
        bool, Meta(description="carried over from an earlier run of the same input, versions and settings")
    ] = False
    parts: Annotated[dict[str, int], Meta(description="table -> size in bytes of the part written")] = {}
    part_rows: Annotated[
        dict[str, int], Meta(description="table -> rows of the part written (layout 2; absent in layout 1)")
    ] = {}
    part_digests: Annotated[
        dict[str, str],
        Meta(description="table -> `sha256:<hex>` of the part's bytes (layout 2; absent in layout 1: unverifiable)"),
    ] = {}
    duplicates: Annotated[
        str, Meta(description='digest of the duplicate ids the shard was told about ("" for none)')
    ] = ""
    schema_version: _VERSION = SCHEMA_VERSION


# --- the manifest ---------------------------------------------------------------------------------------------


class InputFileEntry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """An input file as the manifest lists it: `[url, fingerprint, size]`."""

    url: str
    fingerprint: str
    size: int


class RunInput(_File, frozen=True):
    """What was read."""

    store: Annotated[str, Meta(description="the input as named on the command line")]
    format: Annotated[
        str | None, Meta(description="the log format read where the logs lie (`--format`); null: a canonical store")
    ]
    files: Annotated[
        tuple[InputFileEntry, ...], Meta(description="`[url, fingerprint, size]` of every input file, sorted")
    ]
    ignored: Annotated[tuple[str, ...], Meta(description="files skipped for their extension")]


class EnvironmentOptions(_File, frozen=True):
    """How environments were selected and configured (`--spec-dir`, `--spec`, `--policy`)."""

    spec_dirs: Annotated[tuple[str, ...], Meta(description="extra folders searched for specs")]
    spec: Annotated[str | None, Meta(description="the spec that gives `observed` its schemas")]
    policy: Annotated[str, Meta(description="code or strict")]


class ReadSettings(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """How raw logs were read: `[format, options, labels, limits, allow_no_calls]`."""

    format: str
    options: tuple[tuple[str, str], ...]  # `--option` pairs, sorted
    labels: tuple[tuple[str, str], ...]  # `--label` pairs, sorted
    limits: dict[str, int]  # byte limits: line_bytes, record_bytes, member_bytes
    allow_no_calls: bool


class RunSettings(_File, frozen=True):
    """The settings the run was scored with (never storage credentials)."""

    env: Annotated[str | None, Meta(description="`--env`; null: each rollout's benchmark names its environment")]
    options: Annotated[EnvironmentOptions, Meta(description="environment options")]
    checks: Annotated[tuple[str, ...], Meta(description="the checks applied: schema, dependency, precondition")]
    executor: Annotated[str, Meta(description="ray or inline")]
    read: Annotated[ReadSettings | None, Meta(description="how raw logs were read; null: a canonical store")]


class Counts(_File, frozen=True):
    """Totals over every shard."""

    read: Annotated[int, Meta(description="records read")]
    scored: Annotated[int, Meta(description="rollouts scored")]
    rejected: Annotated[int, Meta(description="records rejected")]
    steps: Annotated[int, Meta(description="calls replayed")]
    shards: Annotated[int, Meta(description="shards in the run")]
    shards_reused: Annotated[int, Meta(description="shards carried over from an earlier run")]


class ShardReuse(_File, frozen=True):
    """Whether one shard's earlier output was reused, and why (or why it was scored again)."""

    shard: Annotated[str, Meta(description="the shard's key")]
    reused: Annotated[bool, Meta(description="its earlier output was kept")]
    why: Annotated[str, Meta(description="what was unchanged, or what changed")]


class Reuse(_File, frozen=True):
    """What a rerun kept of an earlier run of the same folder."""

    core: Annotated[str, Meta(description="the scoring core's code version")]
    shards_reused: Annotated[int, Meta(description="shards kept")]
    shards: Annotated[tuple[ShardReuse, ...], Meta(description="every shard's decision")]


class Manifest(_File, frozen=True):
    """The manifest: written last, after every shard succeeded; a run without it is incomplete."""

    run_id: Annotated[str, Meta(description="the run's id")]
    complete: Annotated[bool, Meta(description="always true: a manifest is written only for a finished run")]
    code_version: Annotated[str, Meta(description="the scoring core's code version")]
    input: Annotated[RunInput, Meta(description="what was read")]
    settings: Annotated[RunSettings, Meta(description="how it was scored")]
    environments: Annotated[
        dict[str, str | None], Meta(description="every environment used, with its version (null: did not resolve)")
    ]
    counts: Annotated[Counts, Meta(description="totals; read = scored + rejected")]
    reconciled: Annotated[bool, Meta(description="read = scored + rejected held in every shard")]
    shards: Annotated[tuple[ShardMarker, ...], Meta(description="every shard's marker, in input order")]
    reuse: Annotated[Reuse, Meta(description="what was kept of an earlier run")]
    started_at: Annotated[str, Meta(description="ISO 8601, UTC")]
    finished_at: Annotated[str, Meta(description="ISO 8601, UTC")]
    seconds: Annotated[float, Meta(description="wall time of the whole run")]
    schema_version: _VERSION = SCHEMA_VERSION


# --- one encoder, one decoder ---------------------------------------------------------------------------------

RunFile = TypeVar("RunFile", Plan, ShardMarker, Manifest)


class _Version(msgspec.Struct):
    schema_version: int = 1


def encode(record: Plan | ShardMarker | Manifest, indent: bool = True) -> bytes:
    """The file's bytes: keys sorted, indented for a person (markers, many per run, on one line)."""
    option = orjson.OPT_SORT_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    return orjson.dumps(msgspec.to_builtins(record), option=option)


def decode(kind: type[RunFile], data: bytes, where: str) -> RunFile:
    """The record `data` holds, checked against `kind`, with `schema_version` the layout the file is in (1 when it
    names none); RunFolderError naming `where` when it is not one this pexec reads (damaged, or of an unknown or
    newer layout)."""
    version = _version(data)
    if version not in READ_VERSIONS:
        raise UnknownLayout(f"{where}: {_version_problem(version)}")
    try:
        record = msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise RunFolderError(f"{where}: not a pexec run file of layout {version} ({exc})") from None
    # The type's default is the layout written now; a file that names none is of layout 1, and so are the markers
    # a layout 1 manifest lists.
    return record if version == SCHEMA_VERSION else _of_layout(record, version)


def _of_layout(record: Plan | ShardMarker | Manifest, version: int) -> Any:
    if isinstance(record, Manifest):
        shards = tuple(msgspec.structs.replace(m, schema_version=version) for m in record.shards)
        return msgspec.structs.replace(record, schema_version=version, shards=shards)
    return msgspec.structs.replace(record, schema_version=version)


def _version(data: bytes) -> int:
    """The layout a file says it has: 1 when it names none, this pexec's when it says nothing readable (decoding
    it against its type then says what is wrong)."""
    try:
        return msgspec.json.decode(data, type=_Version).schema_version
    except msgspec.DecodeError:
        return SCHEMA_VERSION


def _version_problem(version: int) -> str:
    if version > SCHEMA_VERSION:
        return (
            f"written by a newer pexec (run folder layout {version}; this pexec reads layouts up to {SCHEMA_VERSION}): "
            "read it with that pexec, or rescore it with this one (--force)"
        )
    return f"unknown run folder layout {version} (this pexec reads layouts {READ_VERSIONS[0]} to {SCHEMA_VERSION})"


# --- the reference page ---------------------------------------------------------------------------------------

_FILES = (
    ("`_plan.json`", Plan),
    ("`_shards/<shard>.json`", ShardMarker),
    ("`_manifest.json`", Manifest),
)


def markdown() -> str:
    """The fields of each file and of the objects inside them, for docs/reference/run-folder.md."""
    out: list[str] = []
    seen: set[type] = set()
    queue: list[tuple[str, type]] = list(_FILES)
    while queue:
        title, cls = queue.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        doc = " ".join((cls.__doc__ or "").split())
        out += [f"**{title}** — {doc}", "", "| field | type | meaning |", "|---|---|---|"]
        for f in info.fields:
            kind, meaning = f.type, ""
            if isinstance(kind, msgspec.inspect.Metadata):
                meaning = (kind.extra_json_schema or {}).get("description", "")
                kind = kind.type
            for nested in _structs(kind):
                queue.append((f"`{nested.__name__}`", nested))
            out.append(f"| `{f.encode_name}` | {_type_name(kind)} | {meaning} |")
        out.append("")
    return "\n".join(out)


def _structs(kind: msgspec.inspect.Type) -> list[type]:
    """The objects (not the `[…]` rows) a field holds, to describe after the file."""
    if isinstance(kind, msgspec.inspect.StructType):
        return [] if kind.array_like else [kind.cls]
    if isinstance(kind, msgspec.inspect.UnionType):
        return [c for t in kind.types for c in _structs(t)]
    if isinstance(kind, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        return _structs(kind.item_type)
    return []


def _type_name(kind: msgspec.inspect.Type) -> str:
    simple = {
        msgspec.inspect.StrType: "string",
        msgspec.inspect.IntType: "integer",
        msgspec.inspect.FloatType: "number",
        msgspec.inspect.BoolType: "boolean",
        msgspec.inspect.NoneType: "null",
    }
    if type(kind) in simple:
        return simple[type(kind)]
    if isinstance(kind, msgspec.inspect.UnionType):
        return " or ".join(_type_name(t) for t in kind.types)
    if isinstance(kind, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        return f"list of {_type_name(kind.item_type)}"
    if isinstance(kind, msgspec.inspect.TupleType):
        return "[" + ", ".join(_type_name(t) for t in kind.item_types) + "]"
    if isinstance(kind, msgspec.inspect.DictType):
        return f"object of {_type_name(kind.key_type)} → {_type_name(kind.value_type)}"
    if isinstance(kind, msgspec.inspect.StructType):
        if kind.array_like:
            return "`[" + ", ".join(f.name for f in kind.fields) + "]`"
        return f"`{kind.cls.__name__}`"
    raise TypeError(f"no name for {kind!r}")
