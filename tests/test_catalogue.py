"""The metric catalogue (pipeline.core.metric_catalogue): a metric declared in one place reaches every output.

A fixture adds one part and one metric, the share of calls that were invalid (sum of n_invalid over sum of T),
and nothing else: the metric must appear with bounds in `metrics --json`, metrics.parquet, the report's tables
and the paired comparison, with the value computed by hand from the rollouts table. The part files follow
the run schema (pipeline.core.run_schema).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core import metric_catalogue, run_schema
from pipeline.metrics.results import Cohort, Interval, ToolProfile, cohort_fields, ratio
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.metrics.tool_profiles import TOOL_FIELDS
from pipeline.report import Compare, build_report

INVALID_SHARE = metric_catalogue.Metric(
    "invalid_call_share", "invalid calls", "invalid", "calls", doc="invalid / calls"
)
PARTS = (metric_catalogue.Part("invalid", "n_invalid", "invalid calls"), metric_catalogue.Part("calls", "T", "calls"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catalogue")
    runner = CliRunner()
    synth = ["synth", "shop", "--rollouts", "400", "--tasks", "30", "--seed", "5", "--out", str(root / "store")]
    assert runner.invoke(app, synth).exit_code == 0
    assert runner.invoke(app, ["score", str(root / "store"), "--out", str(root / "run"), "--inline"]).exit_code == 0
    return root / "run"


@pytest.fixture
def extra_metric(monkeypatch: pytest.MonkeyPatch) -> metric_catalogue.Metric:
    monkeypatch.setattr(metric_catalogue, "PARTS", (*metric_catalogue.PARTS, *PARTS))
    monkeypatch.setattr(metric_catalogue, "METRICS", (*metric_catalogue.METRICS, INVALID_SHARE))
    return INVALID_SHARE


def by_hand(run: Path) -> dict[tuple[str, str], float]:
    sums: dict[tuple[str, str], list[int]] = {}
    for r in pq.read_table(run / "rollouts").to_pylist():
        s = sums.setdefault((r["model"], r["method"]), [0, 0])
        s[0] += r["n_invalid"]
        s[1] += r["T"]
    return {k: invalid / calls for k, (invalid, calls) in sums.items()}


def test_a_new_metric_reaches_json_and_parquet(run: Path, extra_metric: metric_catalogue.Metric) -> None:
    result = CliRunner().invoke(app, ["metrics", str(run), "--by", "model,method", "--json", "--bootstrap", "200"])
    assert result.exit_code == 0, result.output
    cohorts = [orjson.loads(line) for line in result.stdout.splitlines()]
    expected = by_hand(run)
    assert len(cohorts) == len(expected) == 4
    for c in cohorts:
        m = c["invalid_call_share"]
        assert m["value"] == pytest.approx(expected[(c["model"], c["method"])], rel=1e-15)
        assert 0 < m["lo"] < m["value"] < m["hi"] < 1
    table = pq.read_table(run / "metrics" / "metrics_by_model_and_method" / "metrics.parquet")
    assert table.schema == run_schema.arrow_schema(run_schema.metrics_table(), ["benchmark", "model", "method"])
    assert {"invalid_call_share", "invalid_call_share_lo", "invalid_call_share_hi"} <= set(table.column_names)


def test_a_new_metric_reaches_the_report_and_the_paired_comparison(
    run: Path, tmp_path: Path, extra_metric: metric_catalogue.Metric
) -> None:
    compare = Compare("method", "react", "plan_execute")
    report = build_report(
        open_run(str(run)), tmp_path, ["model", "method"], compare, [1, 3], BootstrapSettings(B=200), figures=False
    )
    md = (tmp_path / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| benchmark | model | method | N |"))
    assert "| invalid calls |" in header
    paired = [r for r in report.paired if r["metric"] == "invalid_call_share"]
    assert len(paired) == 2  # one pair per model
    for r in paired:
        assert r["lo"] <= r["value"] <= r["hi"] and r["value"] == pytest.approx(r["value_a"] - r["value_b"])
    assert "| invalid calls |" in md.split("## Paired comparison", 1)[1]
    csv_header = (tmp_path / "tables" / "metrics.csv").read_text().splitlines()[0]
    assert '"invalid_call_share_lo"' in csv_header


def test_without_the_fixture_the_metric_is_absent(run: Path) -> None:
    result = CliRunner().invoke(app, ["metrics", str(run), "--json", "--bootstrap", "20"])
    assert "invalid_call_share" not in result.stdout


def test_part_files_follow_the_run_schema(run: Path) -> None:
    """What scoring writes is pipeline.core.run_schema's declaration: ids, labels, fields (+ costs) in that order."""
    labels = ["method", "model"]
    steps = pq.read_table(run / "steps").schema
    assert steps.remove_metadata() == run_schema.arrow_schema(run_schema.STEPS, labels)
    rollouts = pq.read_table(run / "rollouts").schema
    costs = [n for n in rollouts.names if n.startswith("cost_")]
    assert costs and rollouts.remove_metadata() == run_schema.arrow_schema(run_schema.ROLLOUTS, labels, costs)


def test_the_result_types_declare_every_key_the_code_writes(run: Path, extra_metric: metric_catalogue.Metric) -> None:
    """pipeline.metrics.results names what `metrics --json` and the per-tool profiles hold: a cohort's (and a
    profile's) keys are its cohort columns, then exactly the keys the TypedDict declares and, for a cohort, one
    Interval per ratio metric of the catalogue (a metric added there, as the fixture does, needs nothing else)."""
    opened = open_run(str(run))
    cohort = opened.cohorts(["model"], BootstrapSettings(B=20))[0]
    declared = Cohort.__required_keys__ | Cohort.__optional_keys__
    ratios = {m.name for m in metric_catalogue.ratios()}
    assert list(cohort)[:2] == ["benchmark", "model"] and extra_metric.name in ratios
    assert set(cohort) - {"model"} == declared | ratios == {"benchmark", *cohort_fields()}
    interval_keys = Interval.__required_keys__ | Interval.__optional_keys__
    for name in ratios:
        assert {"value", "lo", "hi"} <= set(ratio(cohort, name)) <= interval_keys
    assert set(ratio(cohort, "rr")) == {"value", "lo", "hi", "method", "eligible", "small_sample"}
    profile = opened.tool_profiles(["model"], BootstrapSettings(B=20))[0]
    declared = ToolProfile.__required_keys__ | ToolProfile.__optional_keys__
    assert list(profile)[:3] == ["benchmark", "tool", "model"]
    assert set(profile) - {"model"} == declared == {"benchmark", "tool", *TOOL_FIELDS}
