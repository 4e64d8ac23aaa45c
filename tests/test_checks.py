"""`--checks`: which of S's schema fit, D and P apply; recorded in the manifest, and shard reuse keys on it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.model import Call, Message, Rollout
from pipeline.core.run_folder import Manifest
from pipeline.envs import get_environment
from pipeline.replay.checker import CHECKS, parse_checks, replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

AVA = Message("user", "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701).")
SIGN_IN = Call("authenticate", {"email": "ava.lopez@example.com", "zip": "78701"})


def flags(*calls: Call, checks: tuple[str, ...] = CHECKS) -> list[tuple[bool, str | None, str | None]]:
    result = replay(get_environment("shop"), Rollout("r", "t", "shop", events=[AVA, *calls]), checks)
    return [(s.valid, s.failed_check, s.detail) for s in result.steps]


def test_each_check_can_be_left_out() -> None:
    invented = Call("get_order", {"order_id": "O9999"})  # grounded: the conversation never showed it
    assert flags(SIGN_IN, invented)[1][:2] == (False, "D")
    without_d = flags(SIGN_IN, invented, checks=("schema", "precondition"))[1]
    assert without_d[:2] == (False, "P")  # the simulator still has no such order
    neither = flags(SIGN_IN, invented, checks=("schema",))[1]
    assert neither[0] is True and neither[2].startswith("P not checked: ")
    wrong_type = Call("get_order", {"order_id": 5})
    assert flags(SIGN_IN, wrong_type)[1][:2] == (False, "S")
    assert flags(SIGN_IN, wrong_type, checks=("dependency", "precondition"))[1][1] != "S"
    # A call that cannot be replayed at all stays an S failure whatever is selected.
    assert flags(Call("no_such_tool", {}), checks=("precondition",))[0][:2] == (False, "S")


def test_a_call_valid_only_because_p_is_off_grounds_nothing() -> None:
    # get_user before authenticating is rejected by the shop's precondition; with P off it is valid, but it did
    # not run: a reference to its output does not resolve.
    first = Call("get_user", {"user_id": "U1001"})
    second = Call("get_user", {"user_id": {"$ref": "step1.user_id"}})
    events = [Message("user", "I am U1001"), first, second]
    result = replay(get_environment("shop"), Rollout("r", "t", "shop", events=events), ("schema", "dependency"))
    assert [(s.valid, s.failed_check) for s in result.steps] == [(True, None), (False, "D")]
    assert "step 1 failed" in result.steps[1].detail


def test_parse_checks() -> None:
    assert parse_checks("precondition, schema") == ("schema", "precondition")
    for bad in ("schema,grounding", "", " , "):
        with pytest.raises(ValueError, match="comma-separated subset of schema,dependency,precondition"):
            parse_checks(bad)


def test_the_manifest_records_the_checks_and_reuse_keys_on_them(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(synthesize("shop", 60, 12, seed=3), str(store))
    run = tmp_path / "run"

    def score(*checks: str) -> Manifest:
        return run_scoring(str(store), str(run), ScoreSettings(inline=True, checks=checks or CHECKS))

    first = score("schema", "precondition")
    assert first.settings.checks == ("schema", "precondition")
    assert first.counts.shards_reused == 0
    d = f"SELECT count(*) FROM read_parquet('{run}/steps/*.parquet') WHERE failed_check = 'D'"
    assert duckdb.sql(d).fetchall()[0][0] == 0
    assert score("schema", "precondition").counts.shards_reused == first.counts.shards
    everything = score()
    assert everything.counts.shards_reused == 0 and everything.settings.checks == tuple(CHECKS)
    assert duckdb.sql(d).fetchall()[0][0] > 0  # the synthetic store has D failures once D applies


def test_the_command_line_refuses_unknown_checks(tmp_path: Path) -> None:
    shown = CliRunner().invoke(app, ["score", str(tmp_path), "--out", str(tmp_path / "r"), "--checks", "schema,x"])
    assert shown.exit_code == 2 and "--checks: checks are a comma-separated subset" in shown.output
