"""The metric catalogue: every cohort metric declared once, as a ratio of sums of per-rollout parts.

A *part* is an integer computed per rollout from the `rollouts` table (`p_<name>` in SQL); the DuckDB stage sums parts
per task (`s_<name>`), the bootstrap resamples those sums, and every ratio metric is sum(numerator part) /
sum(denominator part) (docs/explanation/definitions.md, "Aggregates"). Integers keep every sum exact and independent of
the order in which threads add rows up.

Everything that shows a metric reads this catalogue: the SQL of the cohort and the paired bootstrap
(pipeline.metrics.cohorts, pipeline.report.paired), `metrics --json` and metrics.parquet, the terminal table, the
report's tables, its ranking and its paired comparison, and docs/reference/metrics.md (`markdown()`).
To add a metric, add a `Metric` here (and a `Part` if it needs a new per-rollout quantity), with its exact
population; its interval is the task bootstrap, or Wilson on the effective sample size where that degenerates
(pipeline.core.intervals).

PEC(k) is the one curve: a metric per depth k, computed from the depth histogram in
metrics/sql/metrics_prepare.sql rather than from a single pair of parts; its entry fixes its place among the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.core import intervals

# auc_term in [0, 1] is summed in units of 2^-40 (error <= 4.6e-13 per term). Binary units keep the last
# division exact, so TER <= AUC-PEC <= 1 holds exactly: an executable rollout is exactly 2^40 units.
AUC_UNIT = 2.0**40


@dataclass(frozen=True)
class Part:
    """A per-rollout integer: `sql` is an expression over one row of the `rollouts` view."""

    name: str  # p_<name> per rollout, s_<name> summed per task
    sql: str
    doc: str


Quantity = Literal["share", "mean01"]


@dataclass(frozen=True)
class Metric:
    """A cohort metric. `kind="ratio"`: sum(num) / sum(den) / scale, with a task-level bootstrap interval.
    `kind="curve"`: PEC(k), one value per depth k (num and den unused)."""

    name: str  # key in `metrics --json`, column stem in metrics.parquet, `metric` in the paired table
    label: str  # what tables and figures call it
    num: str = ""
    den: str = ""
    scale: float = 1.0  # the unit of the numerator part (AUC_UNIT for auc_pec)
    ranked: bool = False  # ordered against success in the report's ranking divergence
    eligible: str = ""  # when set, the denominator's count is shown beside the value; this says what it counts
    in_tables: bool = True  # a column of the terminal and report metric tables (JSON and Parquet always)
    kind: Literal["ratio", "curve"] = "ratio"
    doc: str = ""
    # The exact population the value is computed over (the reference and docs/explanation/definitions.md, "Aggregates",
    # print it).
    population: str = "every rollout of the cohort"
    # How its small-sample interval is justified (pipeline.core.intervals): a share of counted units, or the mean
    # of a quantity in [0, 1] (the Wilson interval is then conservative).
    quantity: Quantity = "share"
    paired: bool = True  # a row of the report's paired comparison of two conditions


# The sensitivity metrics (`report --sensitivity`), one per check level: name, label, part, scale, quantity.
_LEVEL_METRICS: tuple[tuple[str, str, str, float, Quantity], ...] = (
    ("ter", "TER", "exec", 1.0, "share"),
    ("auc_pec", "AUC-PEC", "auc", AUC_UNIT, "mean01"),
)


PARTS: tuple[Part, ...] = (
    Part("n", "1", "every started rollout"),
    Part("exec", "executable::INTEGER", "fully executable (FED = T + 1)"),
    Part("auc", f"round(auc_term * {int(AUC_UNIT)}::DOUBLE)::BIGINT", "auc_term in units of 2^-40"),
    Part("known", "(success IS NOT NULL)::INTEGER", "the log carries a success verdict"),
    Part("succ", "(success IS TRUE)::INTEGER", "successful"),
    # RR's parts come from `executable` and `success`, the same columns as TER and the success rate, so that
    # success = TER * P(success | executable) + (1 - TER) * RR holds exactly.
    Part("elig", "(NOT executable AND success IS NOT NULL)::INTEGER", "invalid prefix, with a verdict"),
    Part("rec", "(NOT executable AND success IS TRUE)::INTEGER", "invalid prefix, then successful (recovered)"),
    Part("exec_known", "(executable AND success IS NOT NULL)::INTEGER", "fully executable, with a verdict"),
    Part("succ_exec", "(executable AND success IS TRUE)::INTEGER", "fully executable and successful"),
    Part("cmp", "n_output_compared", "calls with both a logged and a replayed output"),
    Part("match", "n_output_compared - n_output_mismatch", "calls whose replayed output equals the logged one"),
    # Harm (pipeline.core.effects): NULL columns (a run scored before effect classes) count in no denominator.
    Part("eff", "(n_writes IS NOT NULL)::INTEGER", "scored with effect classes"),
    Part("wr", "coalesce(n_writes > 0, false)::INTEGER", "at least one write or irreversible call"),
    Part(
        "wauc",
        f"coalesce(round(write_auc_term * {int(AUC_UNIT)}::DOUBLE)::BIGINT, 0)",
        "write_auc_term in units of 2^-40 (0 without writes)",
    ),
    Part("irr_bad", "coalesce(n_invalid_irreversible > 0, false)::INTEGER", "an invalid irreversible call"),
    Part("uncl", "coalesce(n_unclassified > 0, false)::INTEGER", "a call of a tool with no declared effect"),
    Part(
        "wtauc",
        f"coalesce(round(weighted_auc_term * {int(AUC_UNIT)}::DOUBLE)::BIGINT, 0)",
        "weighted_auc_term in units of 2^-40",
    ),
    # Sensitivity to the checks (`report --sensitivity`): executability when only S, or only S and D, count.
    Part("lvl", "(fed_schema IS NOT NULL)::INTEGER", "scored with check-level depths"),
    Part("exec_s", "coalesce(fed_schema = T + 1, false)::INTEGER", "no schema failure"),
    Part("exec_sd", "coalesce(fed_schema_dependency = T + 1, false)::INTEGER", "no schema or dependency failure"),
    Part(
        "auc_s",
        f"coalesce(round(CASE WHEN T = 0 THEN 1.0 ELSE (fed_schema - 1) / T END * {int(AUC_UNIT)}::DOUBLE)::BIGINT, 0)",
        "auc_term with only S failures counted, in units of 2^-40",
    ),
    Part(
        "auc_sd",
        "coalesce(round(CASE WHEN T = 0 THEN 1.0 ELSE (fed_schema_dependency - 1) / T END * "
        f"{int(AUC_UNIT)}::DOUBLE)::BIGINT, 0)",
        "auc_term with only S and D failures counted, in units of 2^-40",
    ),
)

METRICS: tuple[Metric, ...] = (
    Metric(
        "success",
        "success",
        "succ",
        "known",
        doc="the benchmark's own verdict",
        population="rollouts with a verdict (success not null); `n_unknown_success` counts the others",
    ),
    Metric("ter", "TER", "exec", "n", ranked=True, doc="share of fully executable rollouts"),
    Metric(
        "auc_pec",
        "AUC-PEC",
        "auc",
        "n",
        scale=AUC_UNIT,
        ranked=True,
        doc="mean of (FED - 1) / T (1 when T = 0)",
        quantity="mean01",
    ),
    Metric(
        "pec",
        "PEC",
        kind="curve",
        doc="PEC(k): share of rollouts with T >= k and FED > k (PEC(0) = 1 by definition)",
    ),
    Metric(
        "rr",
        "RR",
        "rec",
        "elig",
        eligible="rollouts with an invalid prefix and a verdict",
        doc="recovery rate: successful among rollouts with an invalid prefix",
        population="rollouts with an invalid prefix and a verdict (`rr_eligible`)",
    ),
    Metric(
        "success_given_executable",
        "P(success | executable)",
        "succ_exec",
        "exec_known",
        eligible="fully executable rollouts with a verdict",
        in_tables=False,
        doc="successful among fully executable rollouts; success = TER_v * this + (1 - TER_v) * RR exactly, "
        "TER_v = its eligible count / (its eligible count + rr_eligible)",
        population="fully executable rollouts with a verdict (`success_given_executable_eligible`)",
    ),
    Metric(
        "successes_after_invalid_prefix",
        "successes after invalid prefix",
        "rec",
        "succ",
        in_tables=False,
        doc="share of the successes that came after an invalid prefix",
        population="successful rollouts",
    ),
    Metric(
        "output_match",
        "output match",
        "match",
        "cmp",
        eligible="calls with a logged and a replayed output",
        doc="replay faithfulness: calls whose replayed output equals the logged one",
        population="calls with both a logged and a replayed output (`output_match_eligible`)",
        paired=False,  # a property of the replay, not a condition to compare
    ),
    Metric(
        "write_auc",
        "AUC-PEC (writes)",
        "wauc",
        "wr",
        scale=AUC_UNIT,
        eligible="rollouts with a write or irreversible call",
        doc="first-invalid-write depth: mean of (write_fed - 1) / n_writes, FED among the write and irreversible "
        "calls only (1 when every write is valid)",
        population="rollouts with at least one write or irreversible call (`write_auc_eligible`); rollouts "
        "without writes are the rest of N, in no write metric",
        quantity="mean01",
    ),
    Metric(
        "irreversible_invalid",
        "invalid irreversible",
        "irr_bad",
        "eff",
        doc="share of rollouts with at least one invalid call of an irreversible tool",
        population="rollouts scored with effect classes (every rollout of a current run)",
    ),
    Metric(
        "weighted_auc_pec",
        "weighted AUC-PEC",
        "wtauc",
        "eff",
        scale=AUC_UNIT,
        doc="mean of (weight of the calls before FED) / (weight of all calls), per-tool weights of effects.toml "
        "(1 when T = 0; equals AUC-PEC when every weight is 1)",
        population="rollouts scored with effect classes (every rollout of a current run)",
        quantity="mean01",
    ),
    Metric(
        "unclassified",
        "unclassified",
        "uncl",
        "eff",
        in_tables=False,
        doc="share of rollouts with a call of a tool whose environment declares no effect class",
        population="rollouts scored with effect classes (every rollout of a current run)",
        paired=False,  # a property of the environment's declarations
    ),
    *(
        Metric(
            f"{kind}_{level}",
            f"{label} ({title})",
            f"{part}_{level}",
            "lvl",
            scale=scale,
            in_tables=False,
            doc=f"{label} when only {checks} failures make a call invalid (`report --sensitivity`)",
            population="rollouts scored with check-level depths (every rollout of a current run)",
            quantity=quantity,
            paired=False,
        )
        for level, title, checks in (("s", "schema only", "S"), ("sd", "schema + dependency", "S and D"))
        for kind, label, part, scale, quantity in _LEVEL_METRICS
    ),
)


def ratios() -> list[Metric]:
    """The ratio metrics, in catalogue order."""
    return [m for m in METRICS if m.kind == "ratio"]


def metric(name: str) -> Metric:
    return next(m for m in METRICS if m.name == name)


def pec() -> Metric:
    return metric("pec")


def markdown() -> str:
    """The table of metrics of docs/reference/metrics.md: each one's key, definition, exact population and
    interval method (tests/test_docs.py checks that the page has it)."""
    small = (
        f"task bootstrap; Wilson on the effective sample size (†) below {intervals.MIN_TASKS} tasks or "
        f"{intervals.MIN_DENOMINATOR} units in the denominator, or at 0/1"
    )
    notes = {
        "share": "",
        "mean01": " (conservative for this mean of a [0, 1] quantity: r (1 − r) bounds its variance)",
    }
    lines = ["| metric | key | what | over | interval |", "|---|---|---|---|---|"]
    for m in METRICS:
        interval = small + notes[m.quantity] + ("; PEC(0) = 1 exactly, no interval method" if m.kind == "curve" else "")
        cells = [m.label, f"`{m.name}`", m.doc, m.population, interval]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
