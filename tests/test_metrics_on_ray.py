"""pipeline.metrics.partials: the poisson-merged metrics computed in Ray tasks, part by part then partition by
partition, equal the single-node ones exactly (values, bounds, moments-based intervals, counts, replicates) for any
cut of the run into parts, any number of partitions, and whichever part a task's rollouts land in."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_aggregate import comparable, random_rows, rollout, write_rollouts
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import MetricsError
from pipeline.metrics import bootstrap, cohorts, partials
from pipeline.metrics.cohorts import metrics_and_replicates
from pipeline.metrics.partials import metrics_on_ray
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings, Population

MERGED = BootstrapSettings(B=60, seed=11, method="poisson-merged")


def write_cut(run: Path, rows: list[dict[str, Any]], part_of: list[int]) -> None:
    """The rows written as parts: row i into part part_of[i] (a part may hold a task's rollouts partly)."""
    shutil.rmtree(run, ignore_errors=True)
    for p in sorted(set(part_of)):
        write_rollouts(run, [r for r, q in zip(rows, part_of, strict=True) if q == p], part=f"part-{p:03d}")


def both(run: Path, **kwargs: Any) -> tuple[Any, Any]:
    snapshot = open_run(str(run)).snapshot
    single = metrics_and_replicates(snapshot, settings=MERGED, replicated=["ter", "rr"], **kwargs)
    on_ray = metrics_on_ray(snapshot, "auto", settings=MERGED, replicated=["ter", "rr"], **kwargs)
    return comparable(single), comparable(on_ray)


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return (
        random_rows(rng, 25, 4, "bench", model="m1")
        + random_rows(rng, 18, 3, "bench", model="m2")
        + random_rows(rng, 9, 5, "other", model="m1")
    )


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bounds_from_partials_equal_the_single_node_ones_for_any_cut(
    rows: list[dict[str, Any]], tmp_path: Path, shared_ray: None, data: st.DataObject
) -> None:
    n_parts = data.draw(st.integers(1, 5))
    part_of = data.draw(st.lists(st.integers(0, n_parts - 1), min_size=len(rows), max_size=len(rows)))
    partitions = data.draw(st.integers(1, 4))
    by = data.draw(st.sampled_from([None, ["model"], ["benchmark"]]))
    write_cut(tmp_path / "run", rows, part_of)
    snapshot = open_run(str(tmp_path / "run")).snapshot
    single = metrics_and_replicates(snapshot, by, MERGED, replicated=["ter", "rr"])
    on_ray = metrics_on_ray(snapshot, "auto", by, MERGED, replicated=["ter", "rr"], partitions=partitions)
    assert comparable(on_ray) == comparable(single)


def test_a_part_without_a_label_column_harness_errors_pools_and_max_k(tmp_path: Path, shared_ray: None) -> None:
    run = tmp_path / "run"
    rng = np.random.default_rng(3)
    write_rollouts(run, random_rows(rng, 12, 3, "bench", model="m1", temp="0.1"), part="part-a")
    write_rollouts(run, random_rows(rng, 12, 3, "bench"), part="part-b")  # no label columns at all
    harness = [{**rollout("t001", 2, 3, True, "pooled", model="m1"), "status": "harness_error"}]
    pooled = [{**r, "status": "ok"} for r in random_rows(rng, 5, 2, "pooled", model="m1")]
    write_rollouts(run, harness + pooled, part="part-c")
    for kwargs in (
        {},
        {"by": ["model"], "max_k": 3},
        {"population": Population(harness_errors="fail", pools=(("all", ("bench", "pooled")),))},
    ):
        single, on_ray = both(run, **kwargs)
        assert on_ray == single, kwargs
    assert any(c["n_harness_error"] for c in single[0])


def test_a_run_of_harness_errors_only(tmp_path: Path, shared_ray: None) -> None:
    write_rollouts(tmp_path, [{**rollout("t1", 2, 3, True, model="m1"), "status": "harness_error"}])
    single, on_ray = both(tmp_path)
    assert on_ray == single
    assert [(c["n"], c["n_harness_error"]) for c in single[0]] == [(0, 1)]


def test_only_the_merged_bootstrap_runs_on_ray_and_pools_are_checked(tmp_path: Path, shared_ray: None) -> None:
    write_rollouts(tmp_path, random_rows(np.random.default_rng(1), 4, 2, "bench"))
    snapshot = open_run(str(tmp_path)).snapshot
    with pytest.raises(MetricsError, match="poisson-merged"):
        metrics_on_ray(snapshot, "auto", settings=BootstrapSettings(method="multinomial"))
    with pytest.raises(MetricsError, match="nope"):
        metrics_on_ray(snapshot, "auto", settings=MERGED, population=Population(pools=(("p", ("nope",)),)))


def test_cohorts_go_a_pass_at_a_time_on_ray_with_the_bounds_of_one_node(
    tmp_path: Path, shared_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each partition yields its partial sums a pass of cohorts at a time and the driver merges them a pass at a
    time: with a pass budget of a few cohorts, the cohorts and their bounds are those of one node."""
    rng = np.random.default_rng(3)
    rows = [r for i in range(21) for r in random_rows(rng, 6, 2, "bench", model=f"m{i}")]
    write_rollouts(tmp_path, rows[::2], part="part-a")
    write_rollouts(tmp_path, rows[1::2], part="part-b")
    snapshot = open_run(str(tmp_path)).snapshot
    settings = BootstrapSettings(B=200, method="poisson-merged")
    here = metrics_and_replicates(snapshot, settings=settings, replicated=["ter"])
    monkeypatch.setattr(cohorts, "PASS_REPLICATE_VALUES", 4 * 200 * 30)  # the driver's passes (Ray's tasks get them)
    merged: list[set[Any]] = []  # the cohorts of each merged partial sums in this process
    original = bootstrap.merge

    def merge(parts: Any) -> Any:
        out = original(parts)
        merged.append(set(out.sums))
        return out

    monkeypatch.setattr(partials.bootstrap, "merge", merge)
    on_ray = metrics_on_ray(snapshot, "auto", settings=settings, replicated=["ter"], partitions=3)
    assert comparable(on_ray) == comparable(here)
    assert max(map(len, merged)) <= 4 and len(set().union(*merged)) == 21


def test_the_cli_computes_on_ray_when_given_an_address(tmp_path: Path, shared_ray: None) -> None:
    rng = np.random.default_rng(2)
    write_rollouts(tmp_path, random_rows(rng, 10, 3, "bench", model="m1"), part="part-a")
    write_rollouts(tmp_path, random_rows(rng, 10, 3, "bench", model="m2"), part="part-b")
    merged = ["--method", "poisson-merged", "--bootstrap", "50", "--json"]
    here = CliRunner().invoke(app, ["metrics", str(tmp_path), *merged])
    on_ray = CliRunner().invoke(app, ["metrics", str(tmp_path), *merged, "--address", "auto"])
    assert here.exit_code == on_ray.exit_code == 0, on_ray.output
    assert on_ray.stdout == here.stdout and '"method":"poisson-merged"' in here.stdout.replace(" ", "")
    refused = CliRunner().invoke(app, ["metrics", str(tmp_path), "--address", "auto"])
    assert refused.exit_code != 0 and "need --method poisson-merged" in refused.output
    assert "Traceback" not in refused.output


def test_a_job_with_the_merged_bootstrap_computes_its_metrics_on_ray(
    tmp_path: Path, shared_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "merged"\ninput = "{tmp_path}/store"\noutput = "{tmp_path}/run"\nshard_mb = 1\n'
        '[synth]\nspec = "shop"\nrollouts = 300\ntasks = 40\nseed = 1\n'
        '[metrics]\nby = ["model"]\nbootstrap = 50\nmethod = "poisson-merged"\n'
    )
    asked: list[str] = []
    import pipeline.metrics.partials as partials

    real = partials.metrics_on_ray
    monkeypatch.setattr(partials, "metrics_on_ray", lambda snapshot, address, *a, **k: (asked.append(address),
                        real(snapshot, address, *a, **k))[1])  # fmt: skip
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 0, result.output
    assert asked == ["local"]
    single = open_run(str(tmp_path / "run")).cohorts(["model"], BootstrapSettings(B=50, method="poisson-merged"))
    written = open_run(str(tmp_path / "run")).sql("SELECT model, ter, ter_lo, ter_hi FROM metrics_by_model")
    assert sorted(written.to_pylist(), key=lambda r: r["model"]) == [
        {"model": c["model"], "ter": c["ter"]["value"], "ter_lo": c["ter"]["lo"], "ter_hi": c["ter"]["hi"]}
        for c in single
    ]


@pytest.fixture(scope="module")
def scored_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scored run of 3 shards whose tasks each lie in every shard (record i in shard i mod 3)."""
    import orjson

    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings
    from pipeline.synthetic.rollouts import synthesize

    root = tmp_path_factory.mktemp("shards")
    records = list(synthesize("shop", 240, 30, 5))
    (root / "store").mkdir()
    for s in range(3):
        lines = b"".join(orjson.dumps(r) + b"\n" for r in records[s::3])
        (root / "store" / f"s{s}.jsonl").write_bytes(lines)
    run_scoring(str(root / "store"), str(root / "run"), ScoreSettings(inline=True))
    assert len(open_run(str(root / "run")).snapshot.parts("steps")) == 3
    return root / "run"


@pytest.mark.parametrize("by", [["model"], ["model", "actor"], []])
def test_tool_profiles_on_ray_equal_the_single_node_ones(scored_shards: Path, shared_ray: None, by: list[str]) -> None:
    """Per-tool profiles from Ray tasks (a shard's rollouts and steps parts, then partitions by task) equal one
    node's with the poisson-merged bootstrap: counts, tasks, causes, first errors, bounds and replicates."""
    from pipeline.metrics.tool_partials import profiles_on_ray
    from pipeline.metrics.tool_profiles import profiles_and_replicates

    snapshot = open_run(str(scored_shards)).snapshot
    here = profiles_and_replicates(snapshot, by, MERGED)
    on_ray = profiles_on_ray(snapshot, "auto", by, MERGED)
    assert comparable(on_ray) == comparable(here)
    assert len(here[0]) > 5 and any(p["causes"] for p in here[0])
    assert sum(p["n_tasks"] for p in here[0]) > len({p["tool"] for p in here[0]}) * 2  # tasks span the shards


def test_tool_profiles_on_ray_need_the_merged_bootstrap_and_check_pools(scored_shards: Path, shared_ray: None) -> None:
    from pipeline.metrics.tool_partials import profiles_on_ray

    snapshot = open_run(str(scored_shards)).snapshot
    with pytest.raises(MetricsError, match="poisson-merged"):
        profiles_on_ray(snapshot, "auto", settings=BootstrapSettings(method="multinomial"))
    with pytest.raises(MetricsError, match="nope"):
        profiles_on_ray(snapshot, "auto", settings=MERGED, population=Population(pools=(("p", ("nope",)),)))


def test_drift_and_tool_metrics_on_ray_print_what_one_node_prints(
    scored_shards: Path, tmp_path: Path, shared_ray: None
) -> None:
    """`pexec diff --unpaired --address` (each run's metrics and tool profiles from Ray tasks) and `pexec metrics
    --by tool --address` print exactly what one node prints with the same bootstrap."""
    import orjson

    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings
    from pipeline.synthetic.rollouts import synthesize

    store = tmp_path / "store.jsonl"
    store.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in synthesize("shop", 90, 12, 9)))
    run_scoring(str(store), str(tmp_path / "a"), ScoreSettings(inline=True))
    merged = ["--method", "poisson-merged", "--bootstrap", "60", "--json"]
    diff = ["diff", str(tmp_path / "a"), str(scored_shards), "--unpaired", "--by", "model", *merged]
    here = CliRunner().invoke(app, diff)
    on_ray = CliRunner().invoke(app, [*diff, "--address", "auto"])
    assert here.exit_code == on_ray.exit_code == 0, on_ray.output
    assert on_ray.stdout == here.stdout and '"kind":"tool"' in here.stdout.replace(" ", "")
    tools = ["metrics", str(scored_shards), "--by", "tool,model", *merged]
    here = CliRunner().invoke(app, tools)
    on_ray = CliRunner().invoke(app, [*tools, "--address", "auto"])
    assert here.exit_code == on_ray.exit_code == 0, on_ray.output
    assert on_ray.stdout == here.stdout and '"invalid_rate"' in here.stdout
    paired = CliRunner().invoke(app, ["diff", str(scored_shards), str(scored_shards), "--address", "auto"])
    assert paired.exit_code == 2 and "apply to drift (--unpaired)" in paired.output


def test_a_job_with_the_merged_bootstrap_computes_its_diff_on_ray(
    tmp_path: Path, shared_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nightly alert goes through Ray too: a job whose [metrics] take the mergeable bootstrap computes its
    [diff] against the previous night (both runs' metrics and tool profiles) in Ray tasks, where it scored."""
    from pipeline.metrics import tool_partials

    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "nightly"\ninput = "{tmp_path}/store/{{date}}"\noutput = "{tmp_path}/run/date={{date}}"\n'
        '[synth]\nspec = "shop"\nrollouts = 120\ntasks = 20\nseed = 3\n'
        '[metrics]\nby = ["model"]\nbootstrap = 40\nmethod = "poisson-merged"\n'
        '[diff]\nagainst = "previous"\nlook_back_days = 2\nfail_on = ["ter<-1"]\n'
    )
    asked: list[tuple[str, str]] = []
    for module, name in ((partials, "metrics_on_ray"), (tool_partials, "profiles_on_ray")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda snapshot, address, *a, _real=real, _name=name, **k: (
            asked.append((_name, address)), _real(snapshot, address, *a, **k))[1])  # fmt: skip
    first = CliRunner().invoke(app, ["run", str(job), "--date", "2026-12-01"])
    assert first.exit_code == 0 and "diff skipped" in first.output, first.output
    asked.clear()
    second = CliRunner().invoke(app, ["run", str(job), "--date", "2026-12-02"])
    assert second.exit_code == 0, second.output
    assert "diff: " in second.output and "date=2026-12-01 (A)" in second.output
    # The night's metrics, then the diff's: both runs' metrics and both runs' tool profiles, all on the local Ray.
    assert asked == [("metrics_on_ray", "local")] * 3 + [("profiles_on_ray", "local")] * 2


def test_a_report_on_ray_writes_the_tables_of_one_node(scored_shards: Path, tmp_path: Path, shared_ray: None) -> None:
    """`pexec report --address` (its metrics and tool profiles from Ray tasks) writes the same tables, to the
    byte of their values, as one node with the same bootstrap."""
    import pyarrow.parquet as pq

    report = ["report", str(scored_shards), "--by", "model", "--method", "poisson-merged", "--bootstrap", "40",
              "--no-figures"]  # fmt: skip
    here = CliRunner().invoke(app, [*report, "--out", str(tmp_path / "here")])
    on_ray = CliRunner().invoke(app, [*report, "--out", str(tmp_path / "ray"), "--address", "auto"])
    assert here.exit_code == on_ray.exit_code == 0, on_ray.output
    tables = sorted(p.relative_to(tmp_path / "here") for p in (tmp_path / "here").rglob("*.parquet"))
    assert {"metrics.parquet", "tools.parquet"} <= {p.name for p in tables}
    for rel in tables:
        assert pq.read_table(tmp_path / "ray" / rel).equals(pq.read_table(tmp_path / "here" / rel)), rel


@pytest.mark.parametrize("cuts", [(3, 2), (1, 1)])
def test_shared_tasks_counted_in_ray_tasks_equal_one_node(tmp_path: Path, shared_ray: None, cuts: Any) -> None:
    """The tasks two runs share, counted from each part's digests cut into partitions (a task's rollouts in
    several parts of a run), equal the count of one node and the sets' intersection."""
    from pipeline.metrics.shared_tasks import shared_tasks

    ids_a = [f"t{i}" for i in range(40)]
    ids_b = [f"t{i}" for i in range(25, 70)]
    for name, ids, parts in (("a", ids_a, cuts[0]), ("b", ids_b, cuts[1])):
        rows = [rollout(t, 1, 2, True) for t in ids for _ in range(2)]  # two rollouts a task, in different parts
        write_cut(tmp_path / name, rows, [i % parts for i in range(len(rows))])
    a, b = open_run(str(tmp_path / "a")).snapshot, open_run(str(tmp_path / "b")).snapshot
    assert shared_tasks(a, b, "auto") == shared_tasks(a, b) == len(set(ids_a) & set(ids_b)) == 15
