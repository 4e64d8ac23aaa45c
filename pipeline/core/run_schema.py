"""The run's tables, declared once (docs/explanation/data-model.md, "The run folder"): the writers
(pipeline.scoring.run_tables, pipeline.metrics.cohorts), the readers (which columns of a run are labels, which must be
there) and the README's "Output" section (checked by tests/test_docs.py) all take their columns from here.

Column order in every table: the fixed id columns, then the rollouts' label columns (strings, under their own
names), then their attribute columns (strings, `attr_<name>`), then the table's own columns; `rollouts` ends with
one `cost_<name>` column per cost the logs carry. Labels are conditions (a default cohort is benchmark × labels);
attributes describe one rollout (termination reason, trial...) and define a cohort only when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from pipeline.core import metric_catalogue


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


@dataclass(frozen=True)
class RunTable:
    name: str
    path: str  # under the run prefix
    row: str  # what one row is
    ids: tuple[Column, ...]
    fields: tuple[Column, ...]  # after the label columns
    labels: str = ""  # how label columns appear (empty: none)
    attributes: str = ""  # how attribute columns appear (empty: none)
    trailer: str = ""  # what the cost columns after the fields hold (rollouts only)

    @property
    def columns(self) -> tuple[Column, ...]:
        return (*self.ids, *self.fields)


_STR, _I32, _I64, _F64, _BOOL = pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_()
_LABELS = "the rollouts' condition labels (`model`, `method`, …)"
ATTRIBUTE_PREFIX = "attr_"
_ATTRIBUTES = "the rollouts' attributes (`attr_termination_reason`, `attr_trial`, `attr_harness_error`, …)"
_STATUS = Column("status", _STR, "ok, or harness_error: the harness never ran it (`attr_harness_error` says why)")

IDS = (
    Column("run_id", _STR, "the run's id (default: the run folder's name)"),
    Column("rollout_id", _STR, "the rollout's id in the input store"),
    Column("task_id", _STR, "the task; the bootstrap resamples tasks"),
    Column("benchmark", _STR, "the environment that scored the rollout"),
)

STEPS = RunTable(
    "steps",
    "steps/part-<shard>.parquet",
    "replayed call",
    IDS,
    (
        _STATUS,
        Column("step", _I32, "1-based depth among the rollout's calls"),
        Column("turn", _I32, "the conversation turn of the call"),
        Column("tool", _STR, "the tool called"),
        Column("valid", _BOOL, "executable in the state left by the calls before it"),
        Column("prefix_executable", _BOOL, "this call and every earlier one are valid"),
        Column("failed_check", _STR, "failed check: S (schema), D (data dependency), P (precondition); null if valid"),
        Column("cause", _STR, "first-error cause label (diagnostic); null if valid"),
        Column("detail", _STR, "the environment's own message, or what failed"),
        Column("decided_by", _STR, "which source decided P: simulator, precondition, log"),
        Column("output_match", _BOOL, "replayed output equals the logged one; null when nothing was logged"),
        Column("effect", _STR, "the tool's effect class: read, write or irreversible; null when undeclared"),
        Column("effect_weight", _F64, "the tool's weight in the weighted AUC-PEC (1 unless declared)"),
    ),
    labels=_LABELS,
    attributes=_ATTRIBUTES,
)

ROLLOUTS = RunTable(
    "rollouts",
    "rollouts/part-<shard>.parquet",
    "rollout",
    IDS,
    (
        _STATUS,
        Column("T", _I32, "number of calls"),
        Column("fed", _I32, "first-error depth; T + 1 when every call is valid"),
        Column("executable", _BOOL, "fed = T + 1"),
        Column("auc_term", _F64, "(fed − 1) / T; 1.0 when T = 0"),
        Column("success", _BOOL, "the benchmark's own verdict from the log; null when it has none"),
        Column("recovered", _BOOL, "not executable and successful; null when success is"),
        Column("first_cause", _STR, "cause of the first invalid call; null when executable"),
        Column("n_invalid", _I32, "invalid calls"),
        Column("n_output_mismatch", _I32, "calls whose replayed output differs from the logged one"),
        Column("n_output_compared", _I32, "calls with both a logged and a replayed output (`output_match` not null)"),
        Column("n_writes", _I32, "calls of write or irreversible tools"),
        Column("n_unclassified", _I32, "calls of tools with no declared effect class"),
        Column("n_invalid_irreversible", _I32, "invalid calls of irreversible tools"),
        Column("write_fed", _I32, "first invalid write's depth among the writes (n_writes + 1: none); null: no writes"),
        Column("write_auc_term", _F64, "(write_fed − 1) / n_writes; null without writes"),
        Column("weighted_auc_term", _F64, "weight of the calls before fed / weight of all calls; 1.0 when T = 0"),
        Column("fed_schema", _I32, "first-error depth counting only schema (S) failures; T + 1 if none"),
        Column("fed_schema_dependency", _I32, "first-error depth counting S and D failures only; T + 1 if none"),
        Column(
            "diverged_before_fed",
            _BOOL,
            "a call before the first error has a replayed output unlike the logged one: fed is not trustworthy",
        ),
    ),
    labels=_LABELS,
    attributes=_ATTRIBUTES,
    trailer="one column per cost the logs carry (`tokens`, `latency_s`, …), as `cost_<name>`",
)

REJECTS = RunTable(
    "rejects",
    "rejects/part-<shard>.parquet",
    "record that could not be scored",
    (Column("run_id", _STR, "the run's id"),),
    (
        Column("shard", _STR, "the shard that read it"),
        Column("source", _STR, "the input file's URL"),
        Column("location", _STR, "where in the file: line, row or byte range"),
        Column("reason", _STR, "why it could not be scored"),
        Column("raw", _STR, "the offending text, truncated"),
    ),
)

# The former name of `failed_check`: steps parts of older runs still carry it (metrics/sql/view_steps.sql reads both).
RETIRED_COLUMNS = frozenset({"check"})
# Columns the outputs use themselves: a label may not take one of these names.
RESERVED_COLUMNS = frozenset(c.name for t in (STEPS, ROLLOUTS, REJECTS) for c in t.columns) | RETIRED_COLUMNS

COHORT_COUNTS = (
    Column("n", _I64, "rollouts in the cohort"),
    Column("n_tasks", _I64, "distinct tasks (the bootstrap's unit)"),
    Column("n_no_calls", _I64, "rollouts with no calls (vacuously executable)"),
    Column(
        "n_unknown_success",
        _I64,
        "rollouts without a verdict (success null): left out of success, RR and P(success | executable)",
    ),
    Column(
        "n_diverged_before_fed",
        _I64,
        "rollouts whose replay diverged from the log before their first error (left out of n under strict_replay)",
    ),
    Column("n_harness_error", _I64, "harness-error rollouts; in n and the metrics only under harness_errors = fail"),
)
# The population the numbers are over (pipeline.metrics.cohorts.Population).
POPULATION = (
    Column("harness_errors", _STR, "exclude (left out of every metric) or fail (counted as non-executable failures)"),
    Column("strict_replay", _BOOL, "the rollouts of n_diverged_before_fed were left out (--strict-replay)"),
)
BOOTSTRAP = (
    Column("bootstrap_B", _I64, "bootstrap replicates"),
    Column("bootstrap_seed", _I64, "seed of the draws"),
    Column("bootstrap_method", _STR, "multinomial (task resampling), poisson or poisson-merged"),
    Column("bootstrap_level", _F64, "confidence level of the intervals"),
    Column("bootstrap_unit", _STR, "what is resampled: task"),
    Column("duckdb_version", _STR, "DuckDB that computed them"),
)
# A partial read (pipeline.metrics.completeness): what the numbers cover. Null counts when the run is complete.
PARTIAL = (
    Column("partial", _BOOL, "read from an incomplete run (`--partial`): the numbers cover only part of it"),
    Column("partial_shards", _I64, "shards read; null when complete"),
    Column("partial_shards_total", _I64, "shards planned; null when complete or no plan was recorded"),
    Column("partial_rollouts", _I64, "rollouts read by the shards read (scored and rejected); null when complete"),
    Column("partial_rollouts_total", _I64, "rollouts in the input; null when complete or unknown (JSON Lines)"),
    Column("partial_input_bytes", _I64, "input bytes the shards read span; null when complete or unknown"),
    Column("partial_input_bytes_total", _I64, "input bytes of the run; null when complete or unknown"),
)
_COHORT_LABELS = "`benchmark` and the cohort's label columns"
_METHODS = "interval method, `bootstrap` or `wilson-clustered` (small sample or estimate at 0/1)"


def metric_columns() -> tuple[Column, ...]:
    """Per ratio metric of the catalogue: value, interval bounds and method and, where it has one, the eligible
    count."""
    out: list[Column] = []
    for m in metric_catalogue.ratios():
        out += [
            Column(m.name, _F64, f"{m.doc}; over {m.population}"),
            Column(f"{m.name}_lo", _F64, f"{m.label}: lower bound"),
            Column(f"{m.name}_hi", _F64, f"{m.label}: upper bound"),
            Column(f"{m.name}_method", _STR, f"{m.label}: {_METHODS}"),
        ]
        if m.eligible:
            out.append(Column(f"{m.name}_eligible", _I64, f"{m.label}'s denominator: {m.eligible}"))
    return tuple(out)


def metrics_table() -> RunTable:
    return RunTable(
        "metrics",
        "metrics/<name>/metrics.parquet",
        "cohort",
        (),
        (*COHORT_COUNTS, *POPULATION, *metric_columns(), *BOOTSTRAP, *PARTIAL),
        labels=_COHORT_LABELS,
    )


PEC = RunTable(
    "pec",
    "metrics/<name>/pec.parquet",
    "cohort and depth k",
    (),
    (
        Column("k", _I64, "depth"),
        Column("value", _F64, "PEC(k): share of the cohort with T ≥ k and fed > k"),
        Column("lo", _F64, "lower bound"),
        Column("hi", _F64, "upper bound"),
        Column("method", _STR, f"{_METHODS}; null for k = 0 (PEC(0) = 1 by definition)"),
    ),
    labels=_COHORT_LABELS,
)


def arrow_schema(
    table: RunTable, labels: Sequence[str] = (), costs: Sequence[str] = (), attributes: Sequence[str] = ()
) -> pa.Schema:
    """The Arrow schema of one part file: ids, the label columns, the attribute columns (given as column names,
    `attr_<name>`), the fields, then the cost columns."""
    return pa.schema(
        [
            *(pa.field(c.name, c.type) for c in table.ids),
            *(pa.field(name, pa.string()) for name in [*labels, *attributes]),
            *(pa.field(c.name, c.type) for c in table.fields),
            *(pa.field(name, pa.float64()) for name in costs),
        ]
    )


def tables() -> tuple[RunTable, ...]:
    """Every table of a run, in the order the README documents them."""
    return (STEPS, ROLLOUTS, REJECTS, metrics_table(), PEC)


def markdown() -> str:
    """The README's description of the run's tables (tests/test_docs.py checks that the README has it)."""
    blocks = []
    for t in tables():
        lines = [f"**`{t.path}`** — one row per {t.row}.", "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in t.ids]
        if t.labels:
            lines.append(f"| `<label>`… | string | {t.labels} |")
        if t.attributes:
            lines.append(f"| `{ATTRIBUTE_PREFIX}<name>`… | string | {t.attributes} |")
        lines += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in t.fields]
        if t.trailer:
            lines.append(f"| `cost_<name>`… | double | {t.trailer} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
