"""report --sensitivity: TER and AUC-PEC under schema-only, schema+dependency and all checks, from one
scoring pass, with known answers."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_aggregate import rollout, write_rollouts

from pipeline.core.model import Rollout, RolloutResult, StepResult
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import build_report
from pipeline.scoring.run_tables import rollouts_table

SMALL = BootstrapSettings(B=100, seed=2)


def steps(*checks: str | None) -> list[StepResult]:
    return [StepResult(i, 1, "t", c is None, False, c, None, None, None, None) for i, c in enumerate(checks, start=1)]


def check_levels(res: RolloutResult) -> dict:
    """The first-error depths under fewer checks, from the rollouts row the scorer writes for `res`."""
    (row,) = rollouts_table("run", [res]).to_pylist()
    return {k: row[k] for k in ("fed_schema", "fed_schema_dependency")}


def test_check_levels_known_answer() -> None:
    res = RolloutResult(Rollout("r", "t", "b"), steps(None, "P", "S"))
    assert (res.fed, check_levels(res)) == (2, {"fed_schema": 3, "fed_schema_dependency": 3})
    res = RolloutResult(Rollout("r", "t", "b"), steps("D", None))
    assert (res.fed, check_levels(res)) == (1, {"fed_schema": 3, "fed_schema_dependency": 1})


def test_sensitivity_table_known_answers(tmp_path: Path) -> None:
    # The two rollouts of test_check_levels_known_answer, in one task.
    rows = [
        rollout("a", 3, 2, False) | {"fed_schema": 3, "fed_schema_dependency": 3},
        rollout("a", 2, 1, False) | {"fed_schema": 3, "fed_schema_dependency": 1},
    ]
    write_rollouts(tmp_path / "run", rows)
    result = build_report(
        open_run(str(tmp_path / "run")), tmp_path / "out", settings=SMALL, sensitivity=True, figures=False
    )
    (row,) = pq.read_table(tmp_path / "out" / "tables" / "sensitivity.parquet").to_pylist()
    assert (row["ter_s"], row["ter_sd"], row["ter"]) == (0.5, 0.0, 0.0)
    assert row["auc_pec_s"] == pytest.approx(5 / 6) and row["auc_pec_sd"] == pytest.approx(1 / 3)
    assert row["auc_pec"] == pytest.approx((1 / 3 + 0) / 2)
    assert (row["n_approx_schema"], row["n_approx_schema_dependency"]) == (2, 1)
    assert "Sensitivity to the checks" in (tmp_path / "out" / "report.md").read_text()
    assert result.tables.cohorts[0]["ter_s"]["value"] == 0.5


def test_without_check_levels_the_values_are_undefined(tmp_path: Path) -> None:
    write_rollouts(tmp_path / "run", [rollout("a", 2, 3, True)])
    build_report(open_run(str(tmp_path / "run")), tmp_path / "out", settings=SMALL, sensitivity=True, figures=False)
    (row,) = pq.read_table(tmp_path / "out" / "tables" / "sensitivity.parquet").to_pylist()
    assert row["ter_s"] is None and row["ter"] == 1.0
