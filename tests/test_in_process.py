"""Where a scoring job runs: a local run of less than IN_PROCESS_BELOW_MB of input scores in this process unless
asked otherwise (starting local Ray costs more than its CPUs save there; `pexec bench start` measures it), and
says so on one line; --num-cpus, --address, $RAY_ADDRESS or a Ray running in the process keep it on Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pipeline.scoring.settings import IN_PROCESS_BELOW_MB, ScoreSettings

ROOT = Path(__file__).resolve().parents[1]
PEXEC = str(Path(sys.executable).with_name("pexec"))
BELOW, ABOVE = IN_PROCESS_BELOW_MB * 2**20 - 1, IN_PROCESS_BELOW_MB * 2**20
LINE = f"in-process: under {IN_PROCESS_BELOW_MB} MiB, Ray's start costs more (--num-cpus N: Ray)"


@pytest.fixture
def no_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """No $RAY_ADDRESS, and no Ray in this process (another test's shared Ray is hidden for the test)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)


def test_a_ray_running_in_this_process_is_used_whatever_the_size(
    no_ray_address: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "ray", running)
    assert ScoreSettings(inline=None).placed(0).inline is False


def test_a_local_run_left_to_decide_scores_in_process_below_the_threshold_only(no_ray_address: None) -> None:
    undecided = ScoreSettings(inline=None)
    assert undecided.placed(0).inline is True and undecided.placed(BELOW).inline is True
    assert undecided.placed(ABOVE).inline is False
    assert undecided.placed(BELOW).executor == "inline" and undecided.placed(ABOVE).executor == "ray"


@pytest.mark.parametrize("named", [{"num_cpus": 1}, {"address": "127.0.0.1:6379"}])
def test_a_ray_named_by_the_settings_is_used_whatever_the_size(no_ray_address: None, named: dict) -> None:
    assert ScoreSettings(inline=None, **named).placed(0).inline is False


def test_ray_address_in_the_environment_is_used_whatever_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert ScoreSettings(inline=None).placed(0).inline is False


def test_a_decided_setting_is_kept(no_ray_address: None) -> None:
    # A job file and a Python caller say inline=False by default: Ray, as before.
    assert ScoreSettings().placed(0).inline is False
    assert ScoreSettings(inline=True).placed(ABOVE).inline is True


def _pexec(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a reader's shell
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["COLUMNS"] = "80"
    return subprocess.run([PEXEC, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    done = _pexec(tmp_path, "synth", "shop", "--rollouts", "200", "--tasks", "20", "--seed", "1", "--out", "store")
    assert done.returncode == 0, done.stderr
    return tmp_path / "store"


def _manifest(run: Path) -> dict:
    return json.loads((run / "_manifest.json").read_text())


def test_pexec_score_of_a_small_store_scores_in_process_and_says_so(tmp_path: Path, store: Path) -> None:
    done = _pexec(tmp_path, "score", "store", "--out", "run")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("plan: 1 file(s)") and lines[1] == LINE, done.stderr
    manifest = _manifest(tmp_path / "run")
    assert manifest["settings"]["executor"] == "inline" and manifest["counts"]["scored"] == 200
    # --inline asked for it: nothing to say
    again = _pexec(tmp_path, "score", "store", "--out", "run2", "--inline")
    assert again.returncode == 0 and LINE not in again.stderr


@pytest.mark.ray
def test_num_cpus_keeps_a_small_store_on_ray_with_the_same_parts(tmp_path: Path, store: Path) -> None:
    inline = _pexec(tmp_path, "score", "store", "--out", "inline/run")
    done = _pexec(tmp_path, "score", "store", "--out", "ray/run", "--num-cpus", "1")
    assert inline.returncode == 0 and done.returncode == 0, done.stderr
    assert LINE not in done.stderr
    manifests = _manifest(tmp_path / "inline" / "run"), _manifest(tmp_path / "ray" / "run")
    assert [m["settings"]["executor"] for m in manifests] == ["inline", "ray"]
    assert manifests[0]["counts"] == manifests[1]["counts"]
    # the same run, byte for byte: the digests of every part of every shard
    assert [s["part_digests"] for s in manifests[0]["shards"]] == [s["part_digests"] for s in manifests[1]["shards"]]
