"""The metrics step takes the cohorts a pass at a time (pipeline.metrics.cohorts.cohort_passes): every pass holds at
most PASS_REPLICATE_VALUES replicate values, so memory follows a pass, not the cohorts × B (1,000 cohorts × 1,000
replicates held at once took 5.2 GB), and the passes give exactly what one pass over every cohort gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_aggregate import comparable

from pipeline.apps.perf.metrics import write_synthetic_rollouts
from pipeline.metrics import cohorts
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import PASS_REPLICATE_VALUES, BootstrapSettings

COHORTS = 60


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cohorts") / "run"
    write_synthetic_rollouts(path, 3_000, 300, n_models=COHORTS)
    return path


def test_a_pass_holds_at_most_its_budget_of_replicate_values_and_every_cohort_once():
    for n, B, columns, K in [(1_000, 1_000, 30, 15), (60, 10_000, 40, 20), (7, 1, 1, 0), (0, 1_000, 30, 15)]:
        passes = cohorts.cohort_passes(n, B, columns, K)
        assert [c for p in passes for c in p] == list(range(n))
        per_cohort = B * (columns + K + 1)
        assert all(len(p) == 1 or len(p) * per_cohort <= PASS_REPLICATE_VALUES for p in passes)
    assert len(cohorts.cohort_passes(1_000, 1_000, 30, 15)) > 1
    [one] = cohorts.cohort_passes(1, 10_000, 1_000, 1_000)  # a cohort over the budget is a pass of its own
    assert one == range(1)


@pytest.mark.parametrize("method", ["multinomial", "poisson", "poisson-merged"])
def test_cohorts_in_several_passes_get_exactly_what_one_pass_gives(run, method, monkeypatch):
    settings = BootstrapSettings(B=200, method=method)
    report = ["invalid_rate", "ter"]
    snapshot = open_run(str(run)).snapshot
    monkeypatch.setattr(cohorts, "PASS_REPLICATE_VALUES", 10**12)
    assert len(cohorts.cohort_passes(COHORTS, 200, 40, 20)) == 1
    whole = cohorts.metrics_and_replicates(snapshot, settings=settings, replicated=report)
    monkeypatch.setattr(cohorts, "PASS_REPLICATE_VALUES", 7 * 200 * 40)  # a few cohorts a pass, one left over
    assert len(cohorts.cohort_passes(COHORTS, 200, 25, 15)) > 8
    passes = cohorts.metrics_and_replicates(snapshot, settings=settings, replicated=report)
    assert comparable(passes) == comparable(whole)
    assert len(passes[0]) == COHORTS
    assert all(c["ter"]["lo"] is not None for c in passes[0])


def test_tool_profiles_go_a_pass_at_a_time_too(tmp_path, monkeypatch):
    import orjson

    from pipeline.metrics.tool_profiles import profiles_and_replicates
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings
    from pipeline.synthetic.rollouts import synthesize

    records = list(synthesize("shop", 240, 30, 0))
    for i, record in enumerate(records):
        record["labels"] = {"model": f"m{i % 12}"}
    store = tmp_path / "store.jsonl"
    store.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    run_scoring(str(store), str(tmp_path / "run"), ScoreSettings(inline=True))
    snapshot = open_run(str(tmp_path / "run")).snapshot
    settings = BootstrapSettings(B=100)
    monkeypatch.setattr(cohorts, "PASS_REPLICATE_VALUES", 10**12)
    whole = profiles_and_replicates(snapshot, ["model"], settings)
    monkeypatch.setattr(cohorts, "PASS_REPLICATE_VALUES", 3 * 100 * 10)
    assert len(cohorts.cohort_passes(len(whole[0]), 100, 5, 0)) > 10
    assert comparable(profiles_and_replicates(snapshot, ["model"], settings)) == comparable(whole)
    assert len(whole[0]) > 12  # tools × models
    assert all(len(values) == 100 for values in whole[1])
    # The profiles alone (`pexec metrics --by tool`, the report) keep no replicate values.
    alone = profiles_and_replicates(snapshot, ["model"], settings, replicates=False)
    assert comparable(alone) == (whole[0], [[]] * len(whole[0]))


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


def test_pec_percentiles_a_share_of_depths_at_a_time_equal_all_at_once(tmp_path, monkeypatch):
    """PEC(k)'s percentiles are taken over a share of the depth columns per query (pipeline.metrics.pec: DuckDB then
    holds a pass's worth of values): one column a query gives exactly what every column at once gives, past the
    deepest depth included."""
    from pipeline.metrics import pec

    write_synthetic_rollouts(tmp_path / "run", 600, 40, n_models=3, max_t=60)
    snapshot = open_run(str(tmp_path / "run")).snapshot
    settings = BootstrapSettings(B=150)
    whole = cohorts.metrics_and_replicates(snapshot, settings=settings, max_k=80)
    monkeypatch.setattr(pec, "PASS_REPLICATE_VALUES", 1)  # one depth column a query
    assert comparable(cohorts.metrics_and_replicates(snapshot, settings=settings, max_k=80)) == comparable(whole)
    curve = whole[0][0]["pec"]
    assert [p["k"] for p in curve] == list(range(81))
    assert curve[0]["value"] == 1.0 and curve[80]["value"] == curve[80]["lo"] == 0.0
    assert curve[80]["method"] == "wilson-clustered"  # no rollout that deep: the small-sample interval, not [0, 0]
    assert 0 < curve[30]["value"] < 1 and curve[30]["lo"] < curve[30]["hi"]


_PEC_PEAK = """
import sys
from pathlib import Path
from pipeline.apps.perf.metrics import write_synthetic_rollouts
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
run = Path(sys.argv[1])
write_synthetic_rollouts(run, 20_000, 1_000, max_t=1_200)
[cohort] = open_run(str(run)).cohorts(None, BootstrapSettings(B=10_000), max_k=1_000)
assert len(cohort["pec"]) == 1_001
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024)
"""


@pytest.mark.memory
def test_one_cohort_at_the_largest_b_and_k_peaks_well_under_a_gigabyte(tmp_path):
    """One cohort cannot be split into passes: at B = 10,000 and 1,000 PEC depths its PEC is held one value per
    depth and replicate, never as B × K rows (which took 1.9 GB), and its percentiles a share of the depths at a
    time. The peak of the whole process, Python and DuckDB included (measured 680-850 MiB)."""
    proc = subprocess.run([sys.executable, "-c", _PEC_PEAK, str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 1_200, f"{proc.stdout.strip()} MiB"
