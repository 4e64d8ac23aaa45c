"""What the viewer shows, read from the run with DuckDB in place (no copy): cohorts with their metrics, the
rollouts behind a number (filtered, one page at a time), one rollout's steps beside its logged events.

The run is opened once with pipeline.metrics.cohorts's helpers (the `rollouts` view, its checks, the storage
filesystem); view/sql/located.sql adds the shard each row was scored in, which names a rollout uniquely
(run_id, shard, rollout_id) and leads back to its input through the manifest's shard list.
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
from collections import OrderedDict
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict

import orjson
import pyarrow.parquet as pq

from pipeline.core import metric_catalogue, run_schema
from pipeline.core.errors import InvalidRecord, RunFolderError, StoreError, ViewError
from pipeline.core.model import NOT_LOGGED, Call, Event, Message
from pipeline.core.records import parse_rollout
from pipeline.core.text import public_url
from pipeline.metrics import results
from pipeline.metrics.cohorts import DEFAULT_METRICS, label_columns
from pipeline.metrics.duck import fetch, rollout_columns, run_sql, set_variables
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, BootstrapSettings
from pipeline.storage.inputs import list_inputs, read_shard
from pipeline.storage.run import MANIFEST, read_manifest, read_plan
from pipeline.storage.shards import Shard

PAGE = 50
INPUT_CACHE_BYTES = 256 * 1024 * 1024  # input shards kept decoded for the rollout pages (records as JSON)
_DEPTH_DIGITS = 9  # a `fed` filter longer than this is no depth a run holds
STATUS = "status"  # ok or harness_error
_SHARD = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Columns a rollouts page lists (the run's labels and the status are added per run).
_ROW_COLUMNS = ("T", "fed", "executable", "success", "first_cause", "n_invalid", "n_output_mismatch")


@dataclass(frozen=True)
class Filters:
    """Which rollouts a page lists; every field None means "any". All of it travels in the URL query."""

    labels: tuple[tuple[str, str | None], ...] = ()  # (column, value); None matches a NULL label
    cause: str | None = None  # first-error cause
    tool: str | None = None  # tool of the first invalid call
    fed: int | None = None  # first-error depth; 0 = executable
    success: str | None = None  # "true", "false" or "null"
    mismatch: bool | None = None  # some replayed output differs from the logged one
    status: str | None = None

    def query(self) -> list[tuple[str, str]]:
        """The URL query pairs that give these filters back (Filters.parse)."""
        out = [(f"label.{c}", v) if v is not None else ("null", c) for c, v in self.labels]
        for name in ("cause", "tool", "fed", "success", "status"):
            value = getattr(self, name)
            if value is not None:
                out.append((name, str(value)))
        if self.mismatch is not None:
            out.append(("mismatch", "1" if self.mismatch else "0"))
        return out

    def without(self, name: str) -> Filters:
        """These filters less the one named: any label, or any value of `name`."""
        match name:
            case "labels":
                return replace(self, labels=())
            case "cause":
                return replace(self, cause=None)
            case "tool":
                return replace(self, tool=None)
            case "fed":
                return replace(self, fed=None)
            case "success":
                return replace(self, success=None)
            case "mismatch":
                return replace(self, mismatch=None)
            case "status":
                return replace(self, status=None)
        raise ViewError(f"no filter {name!r}")

    @classmethod
    def parse(cls, params: list[tuple[str, str]], label_cols: list[str]) -> Filters:
        """Filters from URL query pairs; `label_cols`: the columns a cohort filter may name (benchmark and the
        run's label columns). Unknown columns and malformed values are refused, never ignored."""
        labels: list[tuple[str, str | None]] = []
        cause: str | None = None
        tool: str | None = None
        status: str | None = None
        success: str | None = None
        fed: int | None = None
        mismatch: bool | None = None
        for key, value in params:
            if key.startswith("label.") or key == "null":
                column = key[len("label.") :] if key != "null" else value
                if column not in label_cols:
                    raise ViewError(f"unknown label column {column!r} in the filter")
                labels.append((column, value if key != "null" else None))
            elif value == "":
                continue  # an empty form field: any
            elif key == "cause":
                cause = value
            elif key == "tool":
                tool = value
            elif key == "status":
                status = value
            elif key == "fed":
                if not (value.isascii() and value.isdigit() and len(value) <= _DEPTH_DIGITS):
                    raise ViewError(f"fed must be a depth (0 = executable), got {value!r}")
                fed = int(value)
            elif key == "success":
                if value not in ("true", "false", "null"):
                    raise ViewError(f"success must be true, false or null, got {value!r}")
                success = value
            elif key == "mismatch":
                if value not in ("0", "1"):
                    raise ViewError(f"mismatch must be 0 or 1, got {value!r}")
                mismatch = value == "1"
        return cls(
            labels=tuple(labels), cause=cause, tool=tool, fed=fed, success=success, mismatch=mismatch, status=status
        )


@dataclass(frozen=True)
class Cohort:
    key: results.Labels  # benchmark and the cohort's label values
    n: int
    n_tasks: int
    metrics: list[tuple[metric_catalogue.Metric, results.Interval]]  # value, lo, hi (and eligible)
    causes: list[tuple[str, int]]  # first-error cause ("" = executable) -> rollouts


@dataclass(frozen=True)
class Cohorts:
    keys: list[str]
    cohorts: list[Cohort]
    source: str  # where the numbers come from, shown on the page


# A row of the run's own tables (`SELECT *` of rollouts or steps): its columns are the run's (labels, attributes,
# costs), whatever they are; the templates show them by name.
TableRow = dict[str, Any]


@dataclass(frozen=True)
class Page:
    columns: list[str]
    rows: list[TableRow]
    total: int
    next_after: tuple[str, str, str] | None  # (run_id, rollout_id, shard) of the last row when more follow


class CallShown(TypedDict):
    """A logged call on the rollout page, with the verdict of its step (None: the run has no such step)."""

    kind: Literal["call"]
    call: Call
    step: TableRow | None
    output: str | None  # the logged output as JSON; None when the log has none


class MessageShown(TypedDict):
    kind: Literal["message"]
    message: Message


@dataclass
class RolloutView:
    summary: TableRow  # the rollouts row, with its part file (`_file`) and shard (`_shard`)
    steps: list[TableRow]
    events: list[CallShown | MessageShown] = field(default_factory=list)  # in log order
    input_note: str = ""  # why the logged events are not shown, when they are not


class RunView:
    """One run opened for the viewer's lifetime; DuckDB's connection is used by one request at a time."""

    def __init__(self, run: Run, settings: BootstrapSettings = DEFAULT_BOOTSTRAP, inputs: tuple[str, ...] = ()) -> None:
        self.run = run
        self.storage_options = run.storage_options
        self.settings = settings
        self.root = run.snapshot.root
        # Where a rollout page may read the input its rollout was scored from: the run's own folder, and the
        # places the user names (`--inputs`). A run's manifest is not trusted to name what the viewer fetches.
        self.input_places = (self.root.url, *inputs)
        # Of a partial run only committed shards are read, and every page says what they cover.
        covered = run.snapshot.partial()
        self.coverage_note = covered.describe() if covered else ""
        self._stack = ExitStack()
        self.con = self._stack.enter_context(run.connect())
        # rollouts_files is set by run.connect; steps_files is the one-rollout page's (sql/rollout_steps.sql).
        set_variables(self.con, located_steps_files=run.snapshot.parts("steps"))
        run_sql(self.con, "apps/view/located")
        self.columns = rollout_columns(self.con)
        self.labels = label_columns(self.columns)
        self._lock = threading.Lock()
        self._cohorts: Cohorts | None = None
        # Input shards read for rollout pages, least recently used first: a compressed file is decompressed
        # whole to reach one record, so the next page of the same shard reads it from here.
        self._inputs: OrderedDict[tuple[str, str, int, int | None], dict[str, bytes]] = OrderedDict()
        self._inputs_bytes = 0
        self.inputs_read = 0  # shards read from storage (the cache's misses)

    def close(self) -> None:
        self._stack.close()

    # --- cohorts -----------------------------------------------------------------------------------

    def cohorts(self) -> Cohorts:
        with self._lock:
            if self._cohorts is None:
                self._cohorts = self._load_cohorts()
            return self._cohorts

    def _load_cohorts(self) -> Cohorts:
        stored = self._stored_metrics()
        if stored is not None:
            keys, rows, source = stored
        else:
            computed = self.run.cohorts(None, self.settings)
            keys = ["benchmark", *self.labels]
            rows = [_from_dict(c, keys) for c in computed]
            s = self.settings
            source = f"computed now from the rollouts (task bootstrap, {s.method}, B={s.B}, seed {s.seed})"
        causes = self._causes(keys)
        return Cohorts(keys, [replace(c, causes=causes.get(results.key_values(c.key, keys), [])) for c in rows], source)

    def _stored_metrics(self) -> tuple[list[str], list[Cohort], str] | None:
        """The metrics over every label (RUN/metrics/metrics/metrics.parquet, as `pexec metrics` without --by
        writes them) when they are current: written after the run's manifest, with the same rollouts per
        cohort as the run has now. Otherwise None (the metrics are computed instead)."""
        rel = f"metrics/{DEFAULT_METRICS}/metrics.parquet"
        if rel not in self.run.snapshot.files or MANIFEST not in self.run.snapshot.files:
            return None
        fs, base = self.root.fs, self.root.path
        try:
            if fs.modified(f"{base}/{rel}") < fs.modified(f"{base}/{MANIFEST}"):
                return None
        except (NotImplementedError, OSError):  # a store that cannot tell: the file's age is unknown
            return None
        with fs.open(f"{base}/{rel}", "rb") as f:
            table = pq.read_table(f)
        fields = {c.name for c in run_schema.metrics_table().columns}
        keys = [c for c in table.column_names if c not in fields]
        if any(k not in self.columns for k in keys):
            return None
        rows = [_from_row(r, keys) for r in table.to_pylist()]
        if {results.key_values(c.key, keys): c.n for c in rows} != self._counts(keys):
            return None
        first = table.slice(0, 1).to_pylist()[0] if table.num_rows else {}
        source = (
            f"{rel} (task bootstrap, {first.get('bootstrap_method')}, B={first.get('bootstrap_B')}, "
            f"seed {first.get('bootstrap_seed')})"
        )
        return keys, rows, source

    def _counts(self, keys: list[str]) -> dict[results.Key, int]:
        out: dict[results.Key, int] = {}
        for key, _cause, n in self._cause_rows(keys):
            out[key] = out.get(key, 0) + n
        return out

    def _causes(self, keys: list[str]) -> dict[results.Key, list[tuple[str, int]]]:
        out: dict[results.Key, list[tuple[str, int]]] = {}
        for key, cause, n in self._cause_rows(keys):
            out.setdefault(key, []).append((cause, n))
        return out

    def _cause_rows(self, keys: list[str]) -> list[tuple[results.Key, str, int]]:
        set_variables(self.con, cohort_cols=keys)
        run_sql(self.con, "apps/view/cohort_causes")
        rows = fetch(self.con, "cohort_causes", _CauseCount)
        return [(results.key_values(r["key"], keys), r["cause"], r["n"]) for r in rows]

    # --- rollouts ----------------------------------------------------------------------------------

    def rollouts(self, filters: Filters, after: tuple[str, str, str] | None = None, limit: int = PAGE) -> Page:
        columns = ["run_id", "rollout_id", "task_id", "benchmark", *self.labels, *_ROW_COLUMNS, STATUS]
        # Label and status columns differ from run to run: their conditions are composed here, from column
        # names checked against the run's own (Filters.parse) and quoted; values are always parameters. The
        # tool condition is added only when set (view/sql/filtered.sql says why).
        where, params = ["TRUE"], []
        for column, value in filters.labels:
            where.append(f"{_ident(column)} IS NOT DISTINCT FROM ?")
            params.append(value)
        if filters.status is not None:
            where.append(f"{_ident(STATUS)} = ?")
            params.append(filters.status)
        if filters.tool is not None:
            where.append("(run_id, _shard, rollout_id, fed) IN (SELECT * FROM tool_steps)")
        cond = " AND ".join(where)
        select = ", ".join(_ident(c) for c in columns)
        page_cond, page_params = (
            ("TRUE", []) if after is None else ("row(run_id, rollout_id, _shard) > row(?, ?, ?)", list(after))
        )
        with self._lock:
            set_variables(
                self.con,
                f_cause=filters.cause,
                f_tool=filters.tool,
                f_fed=filters.fed,
                f_success=filters.success,
                f_mismatch=filters.mismatch,
            )
            run_sql(self.con, "apps/view/filtered")
            total = self.con.sql(f"SELECT count(*) FROM filtered WHERE {cond}", params=params).fetchall()[0][0]
            rows = (
                self.con.sql(
                    f"SELECT {select}, _shard FROM filtered WHERE {cond} AND {page_cond} "
                    "ORDER BY run_id, rollout_id, _shard LIMIT ?",
                    params=[*params, *page_params, limit + 1],
                )
                .to_arrow_table()
                .to_pylist()
            )
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if more else None
        next_after = (last["run_id"], last["rollout_id"], last["_shard"]) if last else None
        return Page(columns, rows, total, next_after)

    # --- one rollout -------------------------------------------------------------------------------

    def rollout(self, run_id: str, shard: str, rollout_id: str) -> RolloutView:
        if not _SHARD.match(shard):
            raise ViewError(f"not a shard key: {shard!r}")
        with self._lock:
            set_variables(self.con, r_run=run_id, r_shard=shard, r_id=rollout_id)
            run_sql(self.con, "apps/view/rollout")
            found = fetch(self.con, "one_rollout", TableRow)
            if not found:
                raise ViewError(f"no rollout {rollout_id!r} of run {run_id!r} in shard {shard}")
            summary = found[0]
            # The `steps` view (its column names settled) over the one steps part of the rollout's shard.
            set_variables(self.con, steps_files=[_steps_part(summary["_file"])])
            run_sql(self.con, "metrics/view_steps")
            run_sql(self.con, "apps/view/rollout_steps")
            steps = fetch(self.con, "one_rollout_steps", TableRow)
        view = RolloutView(summary, steps)
        self._attach_input(view, summary["_file"], shard, rollout_id)
        return view

    def _attach_input(self, view: RolloutView, part_file: str, shard: str, rollout_id: str) -> None:
        """The rollout's messages and call arguments, read again from the input it was scored from.

        Only the one shard that holds it is read; a changed input is refused (its events could differ from
        what was scored)."""
        rel = part_file.rsplit("/rollouts/", 1)[0].removeprefix(self.root.url).strip("/")
        try:
            recorded = [read_manifest(self.root, rel=rel), read_plan(self.root, rel=rel)]
        except RunFolderError as exc:
            view.input_note = f"the input cannot be shown: {exc}"
            return
        shards = [s for r in recorded if r is not None for s in r.shards if s.shard == shard]
        if not shards:
            view.input_note = f"the run does not record the input of shard {shard} (no manifest or plan lists it)"
            return
        entry = shards[0]
        if not any(within(entry.source, place) for place in self.input_places):
            view.input_note = (
                f"the input is not read: {public_url(entry.source)} is outside the run and the places given with "
                "--inputs (pass --inputs with it, or a folder above it, to show the logged trajectory)"
            )
            return
        try:
            files, _ = list_inputs(entry.source, self.storage_options)
            file = files[0]
            if file.fingerprint != entry.fingerprint:
                raise StoreError(f"{entry.source} changed since the run scored it")
            records = self._input_records(Shard(file, entry.start, entry.stop), rollout_id)
            if rollout_id in records:
                view.events = _events(parse_rollout(orjson.loads(records[rollout_id])).events, view.steps)
                return
        except (StoreError, InvalidRecord, OSError) as exc:
            view.input_note = f"the input cannot be shown: {exc}"
            return
        view.input_note = f"rollout {rollout_id!r} was not found in its input shard ({entry.source})"

    def _input_records(self, shard: Shard, wanted: str) -> dict[str, bytes]:
        """The shard's records by rollout id (as JSON), from the cache or read once (then kept while they fit
        INPUT_CACHE_BYTES with the others; a shard larger than that is read each time, for `wanted` only)."""
        key = (shard.file.url, shard.file.fingerprint, shard.start, shard.stop)
        with self._lock:
            if key in self._inputs:
                self._inputs.move_to_end(key)
                return self._inputs[key]
        self.inputs_read += 1
        records: dict[str, bytes] = {}
        size, whole = 0, True
        for _location, record in read_shard(shard, self.storage_options):
            if not isinstance(record, dict) or not isinstance(record.get("rollout_id"), str | int):
                continue
            rollout_id = str(record["rollout_id"])
            if whole or rollout_id == wanted:
                try:
                    data = orjson.dumps(record)
                except TypeError:
                    continue  # not JSON the page could show; its rollout says so
                records.setdefault(rollout_id, data)
                size += len(data)
                if whole and size > INPUT_CACHE_BYTES:
                    whole = False
                    records = {k: v for k, v in records.items() if k == wanted}
        if whole:
            with self._lock:
                self._inputs[key] = records
                self._inputs_bytes += size
                while self._inputs_bytes > INPUT_CACHE_BYTES and len(self._inputs) > 1:
                    dropped = self._inputs.popitem(last=False)[1]
                    self._inputs_bytes -= sum(map(len, dropped.values()))
        return records


class _CauseCount(TypedDict):
    """A row of table cohort_causes (view/sql/cohort_causes.sql)."""

    key: results.Labels
    cause: str  # "" for the executable rollouts
    n: int


def _events(events: list[Event], steps: list[TableRow]) -> list[CallShown | MessageShown]:
    """Messages and calls in log order; the i-th call (of either actor) carries the verdict of the step at that
    position (`seq`; the step's `actor` says whose call it was)."""
    by_seq = {s["seq"]: s for s in steps}
    out: list[CallShown | MessageShown] = []
    position = 0
    for e in events:
        if isinstance(e, Call):
            position += 1
            output = None if e.output is NOT_LOGGED else orjson.dumps(e.output, default=str).decode()
            out.append({"kind": "call", "call": e, "step": by_seq.get(position), "output": output})
        else:
            out.append({"kind": "message", "message": e})
    return out


def within(url: str, place: str) -> bool:
    """Whether `url` is `place` or lies below it, both normalised (a local path resolved, `..` applied): the
    one test of what the viewer may read."""
    inside, folder = _normalised(url), _normalised(place).rstrip("/")
    return inside == folder or inside.startswith(folder + "/")


def _normalised(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme == "file":
        return "file://" + os.path.realpath(rest if sep else url)
    return f"{scheme.lower()}://" + posixpath.normpath(rest)


def _steps_part(rollouts_part: str) -> str:
    head, _, tail = rollouts_part.rpartition("/rollouts/")
    return f"{head}/steps/{tail}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _from_dict(c: results.Cohort, keys: list[str]) -> Cohort:
    metrics = [(m, results.ratio(c, m.name)) for m in metric_catalogue.ratios() if m.in_tables]
    return Cohort(dict(zip(keys, results.key_values(c, keys), strict=True)), c["n"], c["n_tasks"], metrics, [])


def _from_row(r: TableRow, keys: list[str]) -> Cohort:
    """A row of metrics.parquet (pipeline.core.run_schema.metrics_table) as the page shows it."""
    metrics: list[tuple[metric_catalogue.Metric, results.Interval]] = []
    for m in metric_catalogue.ratios():
        if m.in_tables:
            value: results.Interval = {"value": r[m.name], "lo": r[f"{m.name}_lo"], "hi": r[f"{m.name}_hi"]}
            if m.eligible:
                value["eligible"] = r[f"{m.name}_eligible"]
            metrics.append((m, value))
    return Cohort({k: r[k] for k in keys}, r["n"], r["n_tasks"], metrics, [])
