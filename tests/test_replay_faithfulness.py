"""Replay faithfulness: per rollout, how many calls had both a logged and a replayed output and
whether the replay diverged from the log before the first error; per cohort, the output-match rate as a
catalogue metric and the count of diverged rollouts; `--strict-replay` leaves those rollouts out and says so.

The store is the synthetic shop store with the logged output of the first call changed in every fourth rollout:
the replayed output then differs there, before the first error whenever that call is valid.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings, Population
from pipeline.report import build_report
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

SETTINGS = BootstrapSettings(B=100, seed=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faithful")
    records = list(synthesize("shop", 240, 40, 4))
    for i, record in enumerate(records):
        first = next(e for e in record["events"] if e["type"] == "call")
        if i % 4 == 0:
            first["output"] = {"logged": "not what the simulator returns"}
    write_store(records, str(root / "store"), "jsonl", 50_000, None)
    run_scoring(str(root / "store"), str(root / "run"), ScoreSettings(inline=True))
    return root / "run"


def by_hand(run: Path) -> dict[str, dict[str, int | bool]]:
    """Per rollout, from the steps table: compared calls, matching calls, divergence before the first error."""
    fed = {r["rollout_id"]: r["fed"] for r in pq.read_table(run / "rollouts").to_pylist()}
    out: dict[str, dict[str, int | bool]] = {r: {"compared": 0, "match": 0, "diverged": False} for r in fed}
    for s in pq.read_table(run / "steps").to_pylist():
        o = out[s["rollout_id"]]
        if s["output_match"] is not None:
            o["compared"] += 1
            o["match"] += s["output_match"]
            o["diverged"] = o["diverged"] or (not s["output_match"] and s["step"] < fed[s["rollout_id"]])
    return out


def test_rollout_columns(run: Path) -> None:
    expected = by_hand(run)
    rows = pq.read_table(run / "rollouts").to_pylist()
    for r in rows:
        e = expected[r["rollout_id"]]
        assert (r["n_output_compared"], r["diverged_before_fed"]) == (e["compared"], e["diverged"])
        assert r["n_output_compared"] - r["n_output_mismatch"] == e["match"]
    diverged = sum(r["diverged_before_fed"] for r in rows)
    assert 30 < diverged <= 60  # most of the 60 changed rollouts (the first call is valid in most)


def test_output_match_rate_and_diverged_count(run: Path) -> None:
    expected = by_hand(run)
    [c] = open_run(str(run)).cohorts([], SETTINGS)
    compared = sum(e["compared"] for e in expected.values())
    match = sum(e["match"] for e in expected.values())
    assert c["output_match"]["eligible"] == compared and c["output_match"]["value"] == match / compared
    assert c["output_match"]["lo"] < c["output_match"]["value"] < c["output_match"]["hi"]
    assert c["output_match"]["method"] == "bootstrap"  # 40 tasks, thousands of calls, not at 1
    assert c["n_diverged_before_fed"] == sum(e["diverged"] for e in expected.values())
    assert c["strict_replay"] is False and c["n"] == 240


def test_strict_replay_leaves_them_out_and_says_so(run: Path, tmp_path: Path) -> None:
    expected = by_hand(run)
    diverged = {r for r, e in expected.items() if e["diverged"]}
    rows = [r for r in pq.read_table(run / "rollouts").to_pylist() if r["rollout_id"] not in diverged]
    result = CliRunner().invoke(app, ["metrics", str(run), "--bootstrap", "50", "--strict-replay", "--json"])
    assert result.exit_code == 0, result.output
    cohorts = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert all(c["strict_replay"] for c in cohorts)
    assert sum(c["n"] for c in cohorts) == len(rows) == 240 - len(diverged)
    assert sum(c["n_diverged_before_fed"] for c in cohorts) == len(diverged)
    for c in cohorts:
        kept = [r for r in rows if (r["model"], r["method"]) == (c["model"], c["method"])]
        assert c["ter"]["value"] == sum(r["executable"] for r in kept) / len(kept)
    table = CliRunner().invoke(app, ["metrics", str(run), "--bootstrap", "50", "--strict-replay"])
    assert f"--strict-replay: {len(diverged)} rollout(s) whose replay diverged" in " ".join(table.stdout.split())
    report = build_report(
        open_run(str(run)), tmp_path, [], settings=SETTINGS, population=Population(strict_replay=True), figures=False
    )
    [r] = report.tables.recovery
    assert r["n"] == len(rows)
    md = (Path(report.out) / "report.md").read_text()
    assert "--strict-replay: rollouts whose replay diverged before their first error are left out." in md
    assert f"--strict-replay: {len(diverged)} rollout(s)" in md
