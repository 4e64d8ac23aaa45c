"""The guard applies the batch scorer's record limits: what `pexec score` rejects, the guard refuses with the same
reason; what it scores as an S failure, the guard gives the same verdict — never a 500, a hang or a silent pass.

A hypothesis property over the nesting depth and size of arguments (as objects and as JSON text) and of `env`
compares the scorer's own path for one JSON line (decode, parse_rollout, replay) with the guard's for the same
call as a request body; then the measured cases go through a real `pexec guard serve`, and a store of the
generated records through the real scorer.
"""

from __future__ import annotations

import duckdb
import orjson
import pytest
from conftest import examples, stop_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_guard_http import Client, start_server

from pipeline.apps.guard.service import Guard
from pipeline.core.errors import GuardRequestError, InvalidRecord
from pipeline.core.records import MAX_DEPTH, parse_rollout
from pipeline.envs import get_environment
from pipeline.replay.checker import replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings

pytestmark = pytest.mark.fuzz  # an adversarial suite: `make fuzz` runs it longer
EXAMPLES = examples(25)
TOO_DEEP = f"the record nests deeper than {MAX_DEPTH} levels"


def nested(depth: int, width: int) -> str:
    """JSON text of `depth` levels of lists around `width` strings (built as text: orjson writes 254 levels)."""
    leaf = orjson.dumps(["v" * 8] * width).decode() if depth else '"leaf"'
    return "[" * max(depth - 1, 0) + leaf + "]" * max(depth - 1, 0)


def arguments_text(depth: int, width: int, as_text: bool) -> str:
    """A call's `arguments` (an object whose `x` has `depth` levels), as an object or as JSON text."""
    inner = '{"x":' + nested(depth, width) + "}"
    return orjson.dumps(inner).decode() if as_text else inner


def env_text(depth: int) -> str:
    return '{"e":' + nested(depth, 1) + "}" if depth else "{}"


def scorer_outcome(args: str, env: str) -> tuple:
    """What `pexec score` makes of the rollout: ("reject", reason) or ("step", valid, check, detail)."""
    line = (
        f'{{"rollout_id":"r","task_id":"t","benchmark":"observed","env":{env},'
        f'"events":[{{"type":"call","tool":"echo","arguments":{args}}}]}}'
    )
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return ("reject", "not JSON")
    try:
        result = replay(get_environment("observed"), parse_rollout(record))
    except InvalidRecord as exc:
        return ("reject", str(exc))
    step = result.steps[0]
    return ("step", step.valid, step.failed_check, step.detail)


def guard_outcome(guard: Guard, args: str, env: str) -> tuple:
    """What the guard answers for the same call as a stateless request body (parsed as the HTTP service does)."""
    body = f'{{"start":{{"env":{env}}},"events":[],"call":{{"tool":"echo","arguments":{args}}}}}'
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ("reject", "not JSON")
    try:
        verdict = guard.check_stateless(parsed)
    except GuardRequestError as exc:
        assert exc.status == 400, exc
        return ("reject", str(exc))
    return ("step", verdict["valid"], verdict["failed_check"], verdict["detail"])


def same(scorer: tuple, guard: tuple) -> bool:
    if scorer[0] == "reject" or guard[0] == "reject":
        if scorer[0] != guard[0]:
            return False
        # The same reason (the guard names where: `call: …`, `'env': …`). Past orjson's 1,024 levels one of the two
        # cannot decode its text (the record is one level deeper than the request body): not JSON vs too deep.
        return scorer[1] in guard[1] or {scorer[1], guard[1].split(": ", 1)[-1]} == {"not JSON", TOO_DEEP}
    return scorer == guard


@pytest.fixture(scope="module")
def guard() -> Guard:
    return Guard("observed")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    depth=st.one_of(st.integers(0, 80), st.integers(80, 1100)),
    width=st.integers(0, 2000),
    as_text=st.booleans(),
    env_depth=st.one_of(st.just(0), st.integers(0, 300)),
)
def test_the_guard_refuses_what_the_scorer_rejects_for_the_same_reason(guard, depth, width, as_text, env_depth):
    args, env = arguments_text(depth, width, as_text), env_text(env_depth)
    scorer, live = scorer_outcome(args, env), guard_outcome(guard, args, env)
    assert same(scorer, live), (depth, width, as_text, env_depth, scorer, live)


@pytest.mark.parametrize(
    ("depth", "as_text", "env_depth", "expected"),
    [
        (60, False, 0, ("step", True, None, None)),  # the record is 64 levels: scored
        (61, False, 0, ("reject", TOO_DEEP)),  # one more: rejected whole
        (100, False, 0, ("reject", TOO_DEEP)),  # the measured MCP case
        (100, True, 0, ("step", False, "S", f"arguments nest deeper than {MAX_DEPTH} levels")),
        (0, False, 62, ("step", True, None, None)),  # `env` is one level below the record
        (0, False, 63, ("reject", TOO_DEEP)),
        (0, False, 260, ("reject", TOO_DEEP)),  # the measured `env` case (a 500 before)
    ],
)
def test_the_boundaries(guard, depth, as_text, env_depth, expected):
    args, env = arguments_text(depth, 1, as_text), env_text(env_depth)
    assert scorer_outcome(args, env) == expected
    assert same(expected, guard_outcome(guard, args, env))


@pytest.mark.server
def test_deep_requests_over_http_are_400_with_the_scorers_reason(tmp_path):
    proc, port = start_server("--env", "observed", "--token", "s3cret-token")
    client = Client(port)
    try:
        sid = client("POST", "/sessions", {})[1]["session"]
        for depth in (100, 300, 1000, 1030):  # 1,000 deep was a 500 (RecursionError)
            body = f'{{"call":{{"tool":"echo","arguments":{arguments_text(depth, 1, False)}}}}}'.encode()
            status, answer = client("POST", f"/sessions/{sid}/check", raw=body)
            assert status == 400 and (TOO_DEEP in answer["error"] or "not JSON" in answer["error"]), answer
        body = f'{{"env":{env_text(260)}}}'.encode()
        assert client("POST", "/sessions", raw=body) == (400, {"error": f"'env': {TOO_DEEP}"})
        status, verdict = client("POST", f"/sessions/{sid}/check", {"call": {"tool": "echo", "arguments": {"a": 1}}})
        assert status == 200 and verdict["valid"]  # the service is still there

        # The same calls in a store, through the real scorer: rejected for the same reason, or the same S verdict.
        lines = [
            f'{{"rollout_id":"r{depth}{"-text" if text else ""}","task_id":"t","benchmark":"observed",'
            f'"events":[{{"type":"call","tool":"echo","arguments":{arguments_text(depth, 1, text)}}}]}}'
            for depth, text in ((100, False), (100, True), (60, False))
        ]
        (tmp_path / "store").mkdir()
        (tmp_path / "store" / "calls.jsonl").write_text("\n".join(lines) + "\n")
        run_scoring(str(tmp_path / "store"), str(tmp_path / "run"), ScoreSettings(inline=True))
        rejects = duckdb.sql(f"SELECT reason FROM read_parquet('{tmp_path}/run/rejects/*.parquet')").fetchall()
        assert rejects == [(TOO_DEEP,)]
        steps = duckdb.sql(
            f"SELECT rollout_id, valid, failed_check, detail FROM read_parquet('{tmp_path}/run/steps/*.parquet') "
            "ORDER BY rollout_id"
        ).fetchall()
        assert steps == [
            ("r100-text", False, "S", f"arguments nest deeper than {MAX_DEPTH} levels"),
            ("r60", True, None, None),
        ]
        for depth, text in ((100, True), (60, False)):
            call = f'{{"call":{{"tool":"echo","arguments":{arguments_text(depth, 1, text)}}}}}'.encode()
            verdict = client("POST", f"/sessions/{sid}/check", raw=call)[1]
            step = steps[0] if text else steps[1]
            assert (verdict["valid"], verdict["failed_check"], verdict["detail"]) == step[1:]
    finally:
        stop_group(proc)


def test_a_start_the_scorer_would_reject_is_refused_with_its_reason(guard):
    for labels, reason in (({"T": "x"}, "label 'T' clashes with an output column name"), ({"": "x"}, "empty name")):
        with pytest.raises(GuardRequestError, match=reason):
            guard.check_stateless({"start": {"labels": labels}, "events": [], "call": {"tool": "echo"}})
