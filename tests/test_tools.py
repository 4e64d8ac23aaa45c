"""Per-tool error profiles: step-level cohorts with task-clustered intervals, known answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_aggregate import rollout, weights, write_rollouts
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import build_report

SMALL = BootstrapSettings(B=300, seed=5)


def write_run(run: Path, rollouts: list[dict[str, Any]], calls: list[list[tuple[str, bool, str | None]]]) -> None:
    """Rollout i (rollout_id part-0-i) makes calls[i]: (tool, valid, output_match as 'y'/'n'/None)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("run_id", "rollout_id", "task_id", "benchmark", "step", "tool",
                                                  "valid", "cause", "output_match")}  # fmt: skip
    for i, (r, steps) in enumerate(zip(rollouts, calls, strict=True)):
        for j, (tool, valid, match) in enumerate(steps, start=1):
            row = {"run_id": "run", "rollout_id": f"part-0-{i}", "task_id": r["task_id"], "benchmark": r["benchmark"],
                   "step": j, "tool": tool, "valid": valid, "cause": None if valid else f"{tool}_bad",
                   "output_match": None if match is None else match == "y"}  # fmt: skip
            for k in cols:
                cols[k].append(row[k])
    types = {"step": pa.int32(), "valid": pa.bool_(), "output_match": pa.bool_()}
    table = pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})
    (run / "steps").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run / "steps" / "part-0.parquet")
    write_rollouts(run, rollouts)  # commits the shard


def known_run(run: Path) -> None:
    # Task a: search ok, pay invalid (first error at 2); search ok, pay ok.  Task b: search invalid (first), pay
    # invalid; search ok. 5 search calls (1 invalid), 3 pay calls (2 invalid); first errors: pay 1, search 1.
    rollouts = [rollout("a", 2, 2, False), rollout("a", 2, 3, True), rollout("b", 2, 1, False),
                rollout("b", 1, 2, True)]  # fmt: skip
    calls = [
        [("search", True, "y"), ("pay", False, None)],
        [("search", True, "n"), ("pay", True, "y")],
        [("search", False, None), ("pay", False, None)],
        [("search", True, "y")],
    ]
    write_run(run, rollouts, calls)


def test_known_profile(tmp_path: Path) -> None:
    known_run(tmp_path)
    rows = {r["tool"]: r for r in open_run(str(tmp_path)).tool_profiles(settings=SMALL)}
    assert list(rows) == ["pay", "search"]
    pay, search = rows["pay"], rows["search"]
    assert (pay["n_calls"], pay["n_invalid"], pay["n_first_errors"]) == (3, 2, 1)
    assert (search["n_calls"], search["n_invalid"], search["n_first_errors"]) == (4, 1, 1)
    assert pay["invalid_rate"]["value"] == pytest.approx(2 / 3)
    assert search["invalid_rate"]["value"] == pytest.approx(1 / 4)
    assert pay["first_error_share"] == search["first_error_share"] == 0.5
    assert pay["causes"] == [{"cause": "pay_bad", "n": 2}]
    assert search["output_match"]["value"] == pytest.approx(2 / 3) and search["output_match"]["eligible"] == 3
    assert pay["output_match"]["eligible"] == 1


def test_interval_is_clustered_by_task(tmp_path: Path) -> None:
    # 40 tasks, each with one rollout of 4 calls of `t`; tasks 0..19 have all 4 invalid, the rest none. The
    # task-clustered bootstrap of the invalid rate is the numpy resampling of the 40 task sums with the
    # project's draws.
    rollouts, calls = [], []
    for t in range(40):
        bad = t < 20
        rollouts.append(rollout(f"t{t:02d}", 4, 1 if bad else 5, None))
        calls.append([("t", not bad, None)] * 4)
    write_run(tmp_path, rollouts, calls)
    settings = BootstrapSettings(B=400, seed=9)
    (row,) = open_run(str(tmp_path)).tool_profiles(settings=settings)
    inv = np.array([4 if t < 20 else 0 for t in range(40)])
    values = weights(9, 400, 40, "multinomial") @ inv / 160
    assert row["invalid_rate"]["value"] == 0.5
    lo, hi = np.quantile(values, [0.025, 0.975])
    assert row["invalid_rate"]["method"] == "bootstrap"
    assert row["invalid_rate"]["lo"] == pytest.approx(lo) and row["invalid_rate"]["hi"] == pytest.approx(hi)
    # 4 calls per task move together: wider than treating the 160 calls as independent.
    assert row["invalid_rate"]["hi"] - row["invalid_rate"]["lo"] > 1.5 * 2 * 1.96 * (0.25 / 160) ** 0.5


def test_cli_metrics_by_tool(tmp_path: Path) -> None:
    known_run(tmp_path)
    result = CliRunner().invoke(app, ["metrics", str(tmp_path), "--by", "tool", "--json", "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    rows = [orjson.loads(line) for line in result.output.splitlines()]
    assert [(r["tool"], r["n_calls"]) for r in rows] == [("pay", 3), ("search", 4)]
    table = CliRunner().invoke(app, ["metrics", str(tmp_path), "--by", "tool", "--bootstrap", "50"])
    assert table.exit_code == 0, table.output
    assert "pay_bad (2)" in table.output and "clustered by task" in table.output


def test_report_has_the_tool_table_and_figure(tmp_path: Path) -> None:
    known_run(tmp_path / "run")
    result = build_report(open_run(str(tmp_path / "run")), tmp_path / "report", settings=SMALL)
    rows = {r["tool"]: r for r in pq.read_table(tmp_path / "report" / "tables" / "tools.parquet").to_pylist()}
    assert rows["pay"]["n_invalid"] == 2 and rows["pay"]["invalid_rate"] == pytest.approx(2 / 3)
    assert rows["pay"]["causes"] == "pay_bad=2"
    chart = next(c for c in result.charts if c.name == "tool_invalid_rates")
    assert [r[2:5] for r in chart.rows] == [["pay", 3, pytest.approx(2 / 3)], ["search", 4, 0.25]]
    assert "## Per-tool error profile" in (tmp_path / "report" / "report.md").read_text()
