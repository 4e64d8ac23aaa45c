"""The metrics step holds every cohort's bootstrap replicate sums at once: past MAX_COHORT_REPLICATES (cohorts × B)
it refuses in one line that says what to change, before any replicate is drawn (1,000 cohorts × 1,000 replicates
took 5.2 GB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.apps.perf.metrics import write_synthetic_rollouts
from pipeline.core.errors import MetricsError
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import MAX_COHORT_REPLICATES, BootstrapSettings

COHORTS = 60


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cohorts") / "run"
    write_synthetic_rollouts(path, 3_000, 300, n_models=COHORTS)
    return path


def test_cohorts_times_replicates_past_the_limit_are_refused(run):
    over = MAX_COHORT_REPLICATES // COHORTS + 1
    with pytest.raises(MetricsError, match=f"{COHORTS} cohorts × {over:,} bootstrap replicates are over the limit"):
        open_run(str(run)).cohorts(None, BootstrapSettings(B=over))
    cohorts = open_run(str(run)).cohorts(None, BootstrapSettings(B=100))
    assert len(cohorts) == COHORTS


def test_the_command_says_it_in_one_line_and_exits_2(run):
    pexec = str(Path(sys.executable).with_name("pexec"))
    over = str(MAX_COHORT_REPLICATES // COHORTS + 1)
    proc = subprocess.run([pexec, "metrics", str(run), "--bootstrap", over], capture_output=True, text=True)
    assert proc.returncode == 2, proc
    [line] = proc.stderr.strip().splitlines()
    assert "over the limit of 200,000 replicate sums at once: group by fewer labels (--by) or lower --bootstrap" in line


def test_a_run_with_more_label_columns_than_a_cohort_key_takes_needs_by(tmp_path):
    """Rollouts within the per-rollout limit, whose labels together make more columns than a cohort is keyed by:
    `pexec metrics` without --by says so in one line; with --by it computes."""
    import orjson

    from pipeline.core.records import MAX_LABELS
    from pipeline.metrics.settings import MAX_COHORT_COLUMNS
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings
    from pipeline.synthetic.rollouts import synthesize

    records = list(synthesize("shop", 6, 2, 0))
    per = MAX_LABELS // 2
    for i, record in enumerate(records):
        record["labels"] = {"model": "m", **{f"l{i % 3}_{j}": "v" for j in range(per)}}  # 3 × 32 + 1 names
    store = tmp_path / "store.jsonl"
    store.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    run = tmp_path / "run"
    run_scoring(str(store), str(run), ScoreSettings(inline=True))
    pexec = str(Path(sys.executable).with_name("pexec"))
    proc = subprocess.run([pexec, "metrics", str(run)], capture_output=True, text=True)
    assert proc.returncode == 2, proc
    [line] = proc.stderr.strip().splitlines()
    assert f"the run has {3 * per + 1} label columns, over the limit of {MAX_COHORT_COLUMNS}" in line
    assert "--by" in line
    proc = subprocess.run([pexec, "metrics", str(run), "--by", "model", "--bootstrap", "50"], capture_output=True)
    assert proc.returncode == 0, proc.stderr
