"""pexec guard replay: recorded traffic (canonical logs, one written by the MCP guard's own log writer) replayed under
a spec that adds one precondition and one grounded parameter; every count is known by construction."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.guard._journal import RolloutLog
from pipeline.apps.guard.mcp import refusal
from pipeline.apps.guard.replay import replay_traffic
from pipeline.apps.guard.session import open_session
from pipeline.core.model import Call, Rollout
from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions
from pipeline.envs.data import BUILTIN_SPECS
from pipeline.ingest import ingest

RULE = (
    "{ require = \"args.priority != 'high' or seen.get_customer.tier == 'gold'\", "
    'error = "high-priority tickets are for gold customers", clause = "tickets" }'
)
NEW_RULE = f'\n[tool.create_ticket]\ngrounded = ["customer_id"]\nobserved = [\n  {RULE},\n]\n'


@pytest.fixture
def specs(tmp_path: Path) -> tuple[str, str]:
    """OLD: the shipped `support` spec. NEW: the same plus a precondition on create_ticket and `email` grounded in
    find_customer."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(BUILTIN_SPECS / "support", old)
    shutil.copytree(BUILTIN_SPECS / "support", new)
    text = (new / "spec.toml").read_text()
    text = text.replace('[tool.create_ticket]\ngrounded = ["customer_id"]\n', NEW_RULE)
    assert "high-priority tickets" in text
    (new / "spec.toml").write_text(text + '\n[tool.find_customer]\ngrounded = ["email"]\n')
    return str(old), str(new)


def call(tool: str, output: object, error: bool = False, **args: object) -> dict:
    return {"type": "call", "tool": tool, "arguments": args, "output": orjson.dumps(output).decode() if not
            isinstance(output, str) else output, "error": error}  # fmt: skip


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def record(rid: str, success: bool, *events: dict) -> dict:
    return {"rollout_id": rid, "task_id": rid, "benchmark": "observed", "events": list(events), "success": success}


def traffic(folder: Path, old: str) -> Path:
    """Six production rollouts; the counts each one contributes are in the comments."""
    folder.mkdir()
    ticket = {"ticket_id": "T1"}
    rows = [
        # an urgent ticket for a silver customer that went through, and the rollout succeeded: a false refusal
        record("r1", True, user("I'm ann@x.com, please open an urgent ticket"),
               call("find_customer", {"customer_id": "C1"}, email="ann@x.com"),
               call("get_customer", {"customer_id": "C1", "tier": "silver"}, customer_id="C1"),
               call("create_ticket", ticket, customer_id="C1", subject="help", priority="high")),
        # the same, but production rejected it: an error the new rule would have caught
        record("r2", False, user("I'm bob@x.com, this is urgent"),
               call("find_customer", {"customer_id": "C2"}, email="bob@x.com"),
               call("get_customer", {"customer_id": "C2", "tier": "silver"}, customer_id="C2"),
               call("create_ticket", "ticket service: not allowed", True, customer_id="C2", subject="x",
                    priority="high")),
        # an e-mail address the user never gave, looked up successfully: a false refusal
        record("r3", True, user("hello, find my account"),
               call("find_customer", {"customer_id": "C3"}, email="carl@x.com")),
        # an invented e-mail address that production did not find: caught
        record("r4", False, user("hello"), call("find_customer", "no such customer", True, email="dan@x.com")),
        # a gold customer's urgent ticket: refused by neither spec
        record("r6", True, user("I'm eve@x.com"),
               call("find_customer", {"customer_id": "C5"}, email="eve@x.com"),
               call("get_customer", {"customer_id": "C5", "tier": "gold"}, customer_id="C5"),
               call("create_ticket", ticket, customer_id="C5", subject="y", priority="high")),
    ]  # fmt: skip
    (folder / "production.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    # r5: a session of the MCP guard under OLD, written by its own log writer: an invented order id it refused
    # (so production never ran it); NEW refuses it too.
    session = open_session("observed", options=EnvOptions(spec=old), rollout_id="r5", task_id="r5")
    session.message("user", "where is my order?")
    order = Call("get_order", {"order_id": "O9"}, call_id="c1")
    verdict = session.check(order)
    assert not verdict.valid
    session.record(order, output=refusal(verdict, "get_order"), error=True)
    log = RolloutLog(str(folder), session.rollout)
    for event in session.rollout.events:
        log.event(event)
    log.close({})
    session.close()
    return folder


def rollouts(folder: Path) -> list[Rollout]:
    return [parse_rollout(r) for r in ingest("canonical", [str(folder)])]


def test_counts_as_constructed(tmp_path: Path, specs: tuple[str, str]) -> None:
    old, new = specs
    logs = traffic(tmp_path / "logs", old)
    report = replay_traffic(rollouts(logs), new, against=old)
    assert (report.rollouts, report.calls, report.logged_errors, report.guard_refused) == (6, 12, 2, 1)
    assert dict(report.refused) == {
        ("create_ticket", "P precondition"): 2,
        ("find_customer", "D information (grounded email)"): 2,
        ("get_order", "D information (grounded order_id)"): 1,
    }
    assert dict(report.false_refusals) == {
        ("create_ticket", "P precondition"): 1,
        ("find_customer", "D information (grounded email)"): 1,
    }
    assert dict(report.caught) == {
        ("create_ticket", "P precondition"): 1,
        ("find_customer", "D information (grounded email)"): 1,
    }
    assert report.totals() == {"refused": 5, "false_refusals": 2, "caught": 2, "newly_refused": 4, "released": 0}
    # A refusal is checked before the call runs: its detail never claims what the log shows, least of all for the
    # call production logged as an error.
    examples = report.examples[("create_ticket", "P precondition")]
    assert sorted(e["logged_error"] for e in examples) == [False, True]
    assert [e["detail"] for e in examples] == ["high-priority tickets are for gold customers"] * 2
    # The other way round: what NEW refuses and OLD does not is what OLD would let through.
    back = replay_traffic(rollouts(logs), old, against=new)
    assert back.totals() == {"refused": 1, "false_refusals": 0, "caught": 0, "newly_refused": 0, "released": 4}
    assert dict(back.released) == {
        ("create_ticket", "P precondition"): 2,
        ("find_customer", "D information (grounded email)"): 2,
    }


def test_cli_page_json_and_thresholds(tmp_path: Path, specs: tuple[str, str]) -> None:
    old, new = specs
    logs = traffic(tmp_path / "logs", old)
    out = tmp_path / "out"
    runner = CliRunner()
    done = runner.invoke(app, ["guard", "replay", str(logs), "--spec", new, "--against", old, "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "would refuse 5 call(s): 2 in rollouts that succeeded anyway" in done.output
    assert "4 newly refused, 0 refused before" in done.output
    page = (out / "replay.md").read_text()
    assert (
        "| create_ticket | P precondition | 2 |" in page
        and "<td>find_customer</td>" in (out / "replay.html").read_text()
    )
    assert orjson.loads((out / "replay.json").read_bytes())["caught"] == 2
    shown = runner.invoke(app, ["guard", "replay", str(logs), "--spec", new, "--json"])
    data = orjson.loads(shown.stdout.splitlines()[0])
    assert data["refused"] == 5 and data["against"] is None
    failed = runner.invoke(app, ["guard", "replay", str(logs), "--spec", new, "--fail-on", "false_refusals>1"])
    assert failed.exit_code == 1 and "breach false_refusals>1: false_refusals = 2" in failed.output
    bad = runner.invoke(app, ["guard", "replay", str(logs), "--spec", new, "--fail-on", "ter<0"])
    assert bad.exit_code == 2 and "not a count of guard replay" in bad.output
    missing = runner.invoke(app, ["guard", "replay", str(logs), "--spec", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no spec named" in missing.output


def test_tool_names_beyond_the_limit_are_counted_together(
    tmp_path: Path, specs: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.apps.guard.replay as replay_module

    old, new = specs
    logs = traffic(tmp_path / "logs", old)
    monkeypatch.setattr(replay_module, "MAX_TOOLS", 2)  # find_customer and get_customer come first
    report = replay_traffic(rollouts(logs), new)
    other = replay_module.OTHER_TOOLS
    assert dict(report.refused) == {
        ("find_customer", "D information (grounded email)"): 2,
        (other, "P precondition"): 2,
        (other, "D information (grounded order_id)"): 1,
    }
    assert report.other_tools == {"create_ticket", "get_order"} and report.totals()["refused"] == 5
