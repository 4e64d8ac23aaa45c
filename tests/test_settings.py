"""The settings objects (ScoreSettings, MetricsSettings): made alike from a command's options and a job file's keys,
each value checked once, where the object is made, and named as its user wrote it."""

from __future__ import annotations

from itertools import permutations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import pipeline.apps.cli._scoring
from pipeline.apps.cli import app
from pipeline.apps.jobs.definition import load_job
from pipeline.core.errors import MetricsError, SettingError
from pipeline.metrics.settings import MetricsSettings
from pipeline.replay.checker import CHECKS
from pipeline.scoring.settings import MAX_SHARD_MB, ScoreSettings

JOB = """name = "j"
input = "logs"
output = "run"
env = "observed"
spec = "shop"
spec_dirs = ["specs"]
policy = "strict"
address = "ray://head:10001"
shard_mb = 4
num_cpus = 2
inline = true
lease_stale_after = 30
checks = ["precondition", "schema"]
format = "openai"
options = { error_prefix = "Error:" }
labels = { team = "a" }
endpoint_url = "http://127.0.0.1:5555"
storage_options = { anon = true }
allow_empty = true
[metrics]
by = ["model", "method"]
bootstrap = 50
seed = 3
method = "poisson"
harness_errors = "fail"
pool = { all = ["shop", "observed"] }
strict_replay = true
max_k = 7
"""

SCORE_ARGS = ["score", "logs", "--out", "run", "--env", "observed", "--spec", "shop", "--spec-dir", "specs",
              "--policy", "strict", "--address", "ray://head:10001", "--shard-mb", "4", "--num-cpus", "2", "--inline",
              "--lease-stale-after", "30", "--checks", "precondition,schema", "--format", "openai",
              "--option", "error_prefix=Error:", "--label", "team=a", "--endpoint-url", "http://127.0.0.1:5555",
              "--storage-option", "anon=true", "--allow-empty"]  # fmt: skip


def test_a_job_file_and_pexec_score_make_the_same_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[ScoreSettings] = []

    def scored(store: Any, run: str, settings: ScoreSettings, **progress: Any) -> dict[str, Any]:
        asked.append(settings)
        raise SystemExit(0)  # what the command asked for is all this test reads

    monkeypatch.setattr(pipeline.apps.cli._scoring, "run_scoring", scored)
    assert CliRunner().invoke(app, SCORE_ARGS).exit_code == 0
    (tmp_path / "job.toml").write_text(JOB)
    job = load_job(tmp_path / "job.toml", "2026-11-29")
    assert job.scoring == asked[0]
    assert job.scoring.checks == ("schema", "precondition")
    assert job.scoring.storage_options == {"anon": True, "endpoint_url": "http://127.0.0.1:5555"}


def test_a_job_file_and_pexec_metrics_make_the_same_settings(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(JOB)
    from_job = load_job(tmp_path / "job.toml", "2026-11-29").metrics
    from_options = MetricsSettings.from_values(
        by=["model", "method"], bootstrap=50, seed=3, method="poisson", harness_errors="fail",
        pool={"all": ["shop", "observed"]}, strict_replay=True, max_k=7,
    )  # fmt: skip
    assert from_job == from_options
    assert (from_job.by, from_job.bootstrap.B, from_job.population.pools) == (
        ("model", "method"), 50, (("all", ("shop", "observed")),)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["metrics", "RUN", "--seed", "-1"], "error: --seed must be in [0, 2**32), got -1"),
        (["view", "RUN", "--method", "poisson-merged"], "error: --method is multinomial or poisson,"),
        (["metrics", "RUN", "--pool", "p=a", "--pool", "q=a"], "error: --pool: benchmark 'a' is in two pools"),
        (["score", "S", "--out", "R", "--checks", ","], "error: --checks: checks are a comma-separated subset"),
        (["guard", "serve", "--env", "shop", "--policy", "x"], "error: --policy is code or strict, got 'x'"),
    ],
)
def test_the_command_line_names_the_option_of_a_setting_that_does_not_fit(args: list[str], message: str) -> None:
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 2 and shown.stderr.strip().startswith(message), shown.stderr


@given(st.lists(st.sampled_from(CHECKS), min_size=1))
def test_checks_are_kept_in_one_order_whatever_order_they_are_listed_in(listed: list[str]) -> None:
    assert ScoreSettings(checks=tuple(listed)).checks == tuple(c for c in CHECKS if c in listed)


def test_every_order_of_the_checks_is_one_setting() -> None:
    assert len({ScoreSettings(checks=order).checks for order in permutations(CHECKS)}) == 1


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1, max_value=2 * MAX_SHARD_MB))
def test_a_shard_size_is_taken_exactly_when_it_is_a_byte_or_more_and_at_most_the_largest(mb: float) -> None:
    fits = mb * 2**20 >= 1 and mb <= MAX_SHARD_MB
    if fits:
        assert ScoreSettings(shard_mb=mb).shard_bytes == int(mb * 2**20)
        return
    with pytest.raises(SettingError) as refused:
        ScoreSettings(shard_mb=mb)
    assert refused.value.key == "shard_mb" and refused.value.option == "--shard-mb"


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"policy": "lax"}, "policy"),
        ({"num_cpus": 0}, "num_cpus"),
        ({"num_cpus": True}, "num_cpus"),
        ({"lease_stale_after": 86_401}, "lease_stale_after"),
        ({"checks": ()}, "checks"),
        ({"inline": "yes"}, "inline"),
        ({"format": ""}, "format"),
        ({"labels": {"team": 1}}, "labels"),
        ({"spec_dirs": "specs"}, "spec_dirs"),
    ],
)
def test_a_score_setting_that_does_not_fit_is_refused_naming_its_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(SettingError) as refused:
        ScoreSettings(**values)
    assert refused.value.key == key and str(refused.value).startswith(key)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"bootstrap": 0}, "bootstrap"),
        ({"bootstrap": "50"}, "bootstrap"),
        ({"seed": 2**32}, "seed"),
        ({"method": "bayes"}, "method"),
        ({"method": "poisson-merged", "methods": ("multinomial", "poisson")}, "method"),
        ({"harness_errors": "drop"}, "harness_errors"),
        ({"pool": {"p": "shop"}}, "pool"),
        ({"pool": {"p": []}}, "pool"),
        ({"strict_replay": 1}, "strict_replay"),
        ({"max_k": -1}, "max_k"),
        ({"by": "model"}, "by"),
    ],
)
def test_a_metrics_setting_that_does_not_fit_is_refused_naming_its_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(MetricsError) as refused:  # a MetricsError, as before, and a SettingError
        MetricsSettings.from_values(**values)
    assert isinstance(refused.value, SettingError) and refused.value.key == key


def test_a_setting_error_names_what_each_surface_calls_the_setting() -> None:
    error = SettingError("shard_mb", "shard_mb takes a size > 0, got 0")
    assert error.naming(error.option) == "--shard-mb takes a size > 0, got 0"
    with pytest.raises(ValueError):
        SettingError("shard_mb", "a message that does not start with its key")
