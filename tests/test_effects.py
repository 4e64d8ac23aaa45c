"""Harm-weighted invalid calls: effect classes per tool, the rollouts' harm columns, the catalogue's
write metrics with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_aggregate import rollout, write_rollouts

from pipeline.apps.cli._render import metrics_notes
from pipeline.core.effects import Effect, load_effects, parse_effects
from pipeline.core.errors import EffectsError
from pipeline.core.model import Rollout, RolloutResult, StepResult
from pipeline.envs import get_environment
from pipeline.envs.tau._rules import tau_effects
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings, effects_note
from pipeline.report import build_report
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.run_tables import rollouts_table
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMALL = BootstrapSettings(B=100, seed=1)


def step(i: int, valid: bool, effect: str | None, weight: float = 1.0) -> StepResult:
    return StepResult(i, 1, f"t{i}", valid, False, None if valid else "P", None, None, None, None, effect, weight)


EFFECT_COLUMNS = ("n_writes", "n_unclassified", "n_invalid_irreversible", "write_fed", "write_auc_term",
                  "weighted_auc_term")  # fmt: skip


def effect_columns(res: RolloutResult) -> dict:
    """The effect columns of the rollouts row the scorer writes for `res`."""
    (row,) = rollouts_table("run", [res]).to_pylist()
    return {k: row[k] for k in EFFECT_COLUMNS}


def test_effect_columns_known_answer() -> None:
    # read ok, write ok, irreversible (weight 3) invalid, write invalid: fed = 3; writes = [ok, bad, bad].
    steps = [step(1, True, "read"), step(2, True, "write"), step(3, False, "irreversible", 3.0)]
    steps.append(step(4, False, "write"))
    res = RolloutResult(Rollout("r", "t", "b"), steps)
    cols = effect_columns(res)
    assert cols == {
        "n_writes": 3,
        "n_unclassified": 0,
        "n_invalid_irreversible": 1,
        "write_fed": 2,
        "write_auc_term": pytest.approx(1 / 3),
        "weighted_auc_term": pytest.approx(2 / 6),
    }
    reads = RolloutResult(Rollout("r", "t", "b"), [step(1, False, "read"), step(2, True, None)])
    expected = {"n_writes": 0, "n_unclassified": 1, "n_invalid_irreversible": 0, "write_fed": None,
                "write_auc_term": None, "weighted_auc_term": 0.0}  # fmt: skip
    assert effect_columns(reads) == expected


def harm(row: dict, n_writes: int, write_auc: float | None, irreversible_bad: int, weighted: float) -> dict:
    return row | {"n_writes": n_writes, "n_unclassified": 0, "n_invalid_irreversible": irreversible_bad,
                  "write_fed": None, "write_auc_term": write_auc, "weighted_auc_term": weighted}  # fmt: skip


def test_write_metrics_known_answers(tmp_path: Path) -> None:
    rows = [
        harm(rollout("a", 2, 3, True), 0, None, 0, 1.0),  # no writes: not in the write metric's population
        harm(rollout("a", 3, 2, False), 2, 0.5, 1, 0.25),
        harm(rollout("b", 1, 2, True), 1, 1.0, 0, 1.0),
    ]
    write_rollouts(tmp_path, rows)
    (c,) = open_run(str(tmp_path)).cohorts([], SMALL)
    assert c["write_auc"]["value"] == pytest.approx(0.75) and c["write_auc"]["eligible"] == 2
    assert c["irreversible_invalid"]["value"] == pytest.approx(1 / 3)
    assert c["weighted_auc_pec"]["value"] == pytest.approx(0.75)
    assert c["unclassified"]["value"] == 0.0


def test_the_tables_say_what_invalid_irreversible_cannot_see(tmp_path: Path) -> None:
    """A tool without a declared effect class is never counted irreversible: where every rollout called one, the
    0 of "invalid irreversible" says nothing, and both tables say so; where every call has a class, nothing."""
    blind = [harm(rollout(t, 2, 1, False), 0, None, 0, 0.5) | {"n_unclassified": 2} for t in "abc"]
    write_rollouts(tmp_path / "blind", blind)
    (c,) = open_run(str(tmp_path / "blind")).cohorts([], SMALL)
    assert (c["irreversible_invalid"]["value"], c["unclassified"]["value"]) == (0.0, 1.0)
    note = effects_note([c])
    assert note is not None and "up to 100% of a cohort's rollouts" in note and "its 0 says nothing" in note
    assert note in metrics_notes([c])
    report = build_report(open_run(str(tmp_path / "blind")), tmp_path / "report", None, None, [1], SMALL, figures=False)
    assert "its 0 says nothing" in (Path(report.out) / "report.md").read_text()
    write_rollouts(tmp_path / "seen", [harm(rollout(t, 2, 1, False), 0, None, 0, 0.5) for t in "abc"])
    (c,) = open_run(str(tmp_path / "seen")).cohorts([], SMALL)
    assert effects_note([c]) is None and not any("declared effect class" in n for n in metrics_notes([c]))


def test_runs_without_effect_columns_have_undefined_harm_metrics(tmp_path: Path) -> None:
    write_rollouts(tmp_path, [rollout("a", 2, 3, True), rollout("b", 2, 1, False)])
    (c,) = open_run(str(tmp_path)).cohorts([], SMALL)
    for name in ("write_auc", "irreversible_invalid", "weighted_auc_pec", "unclassified"):
        assert c[name]["value"] is None, name  # never 0: "no data" is not "safe"
    assert c["ter"]["value"] == 0.5


def test_scored_steps_carry_effects(tmp_path: Path) -> None:
    write_store(synthesize("shop", 60, 10, 2), str(tmp_path / "store"), "jsonl", 50_000, None)
    run_scoring(str(tmp_path / "store"), str(tmp_path / "run"), ScoreSettings(inline=True))
    steps = pq.read_table(tmp_path / "run" / "steps").to_pylist()
    declared = load_effects(SPECS / "shop")
    unknown = Effect("read", 1.0)  # placeholder for a tool the spec lacks: its step has effect null, weight 1
    assert all(s["effect"] == (declared[s["tool"]].effect if s["tool"] in declared else None) for s in steps)
    assert all(s["effect_weight"] == declared.get(s["tool"], unknown).weight for s in steps)
    assert any(s["tool"] not in declared for s in steps)  # the synthetic logs call unknown tools too
    for r in pq.read_table(tmp_path / "run" / "rollouts").to_pylist():
        mine = [s for s in steps if s["rollout_id"] == r["rollout_id"]]
        assert r["n_writes"] == sum(s["effect"] in ("write", "irreversible") for s in mine)
        assert r["n_unclassified"] == sum(s["tool"] not in declared for s in mine)
        if r["executable"] and r["T"] > 0:
            assert r["weighted_auc_term"] == 1.0


def test_tau_effects_come_from_upstream_tool_types() -> None:
    env = get_environment("tau_airline")
    assert env.tool("get_user_details").effect == Effect("read")  # ToolType.READ upstream
    assert env.tool("update_reservation_flights").effect == Effect("write")  # ToolType.WRITE upstream
    assert env.tool("cancel_reservation").effect == Effect("irreversible", 3.0)  # effects.toml refines a write
    with pytest.raises(Exception, match="write tool upstream"):
        tau_effects({"x": "write"}, {"x": Effect("read")}, "here")
    assert tau_effects({"g": "generic"}, {}, "here") == {}  # generic upstream: undeclared, not a read


@pytest.mark.parametrize("name", ["shop", "support", "toolsandbox", "tau_airline", "tau_retail", "bfcl_v3", "bfcl_v4"])
def test_every_tool_of_the_builtin_environments_has_an_effect(name: str) -> None:
    env = get_environment(name)
    folder = {"bfcl_v4": "bfcl_v3"}.get(name, name)
    tools = json.loads((SPECS / folder / "tools.json").read_text()) if (SPECS / folder / "tools.json").exists() else []
    names = [t.get("name") or t["function"]["name"] for t in tools] or list(env._tools)  # BFCL: its own catalogue
    assert names and all(env.tool(n).effect is not None for n in names), name


def test_bfcl_effects_name_only_real_functions() -> None:
    declared = set(load_effects(SPECS / "bfcl_v3"))
    known = set(get_environment("bfcl_v3")._tools) | set(get_environment("bfcl_v4")._tools)
    assert declared == known


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"x": "delete"}, "effect is one of"),
        ({"x": {"effect": "write", "weight": 0}}, "weight is a number > 0"),
        ({"x": {"effect": "write", "cost": 1}}, "takes a class"),
    ],
)
def test_effects_toml_errors(raw: dict, message: str) -> None:
    with pytest.raises(EffectsError, match=message):
        parse_effects(raw, "here")
