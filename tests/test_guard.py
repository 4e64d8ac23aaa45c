"""The guard's library API (pipeline.guard.session) on the shipped `shop` spec and BFCL: verdicts before
execution, recording, discarded checks, incremental cost, and the indexed grounding history."""

from __future__ import annotations

import re
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from pipeline.dependencies import History
from pipeline.envs import get_environment
from pipeline.guard import GuardSession, open_session
from pipeline.model import Call

AVA = "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701)."
SIGN_IN = Call("authenticate", {"email": "ava.lopez@example.com", "zip": "78701"})


def pending_order() -> str:
    state = get_environment("shop").spec.initial_state
    return next(o for o in state["users"]["U1001"]["orders"] if state["orders"][o]["status"] == "pending")


def signed_in() -> GuardSession:
    session = open_session("shop")
    session.message("user", AVA)
    verdict = session.check(SIGN_IN)
    session.record(SIGN_IN, output=verdict.output)
    return session


def test_a_check_decides_before_anything_is_recorded():
    session = open_session("shop")
    verdict = session.check(SIGN_IN)
    assert (verdict.step, verdict.valid, verdict.check, verdict.cause) == (1, False, "D", "information")
    assert verdict.detail.startswith("email='ava.lopez@example.com'") and session.depth == 0
    session.message("user", AVA)
    verdict = session.check(SIGN_IN)  # repaired by what the user said since
    assert verdict.valid and verdict.output == {"user_id": "U1001"} and verdict.decided_by == "precondition"
    step = session.record(SIGN_IN, output={"user_id": "U1001"})
    assert (step.step, step.valid, step.prefix_executable, step.output_match) == (1, True, True, True)
    schema = session.check(Call("get_user", {"user_id": 1001}))
    assert (schema.valid, schema.check, schema.cause) == (False, "S", "schema")
    unknown = session.check(Call("get_user", {"user_id": "U9999"}))
    assert (unknown.check, unknown.cause) == ("D", "information")
    session.close()


def test_a_checked_call_that_is_not_recorded_leaves_no_trace():
    session = signed_in()
    oid = pending_order()
    cancel = Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})
    session.message("user", f"please cancel {oid}")
    assert session.check(cancel).valid
    assert session.check(cancel).valid  # the first check's cancellation was undone
    session.message("user", "actually, wait")  # anything but recording discards a pending check
    assert session.check(cancel).valid
    step = session.record(cancel, output=None)
    assert step.valid and step.step == 2 and step.output_match is False  # the simulator returned the order
    again = session.check(cancel)
    assert (again.valid, again.check, again.cause) == (False, "P", "state_consistency")
    assert again.message and again.detail == again.message
    session.close()


def test_recording_a_call_other_than_the_checked_one_checks_it():
    session = signed_in()
    oid = pending_order()
    session.message("user", f"order {oid}")
    assert session.check(Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})).valid
    step = session.record(Call("get_order", {"order_id": oid}))
    assert step.valid and step.tool == "get_order"
    assert session.check(Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})).valid  # never cancelled


def test_sessions_do_not_share_state():
    oid = pending_order()
    cancel = Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})
    first, second = signed_in(), signed_in()
    for s in (first, second):
        s.message("user", oid)
    first.record(cancel)
    assert not first.check(cancel).valid
    assert second.check(cancel).valid
    first.close()
    second.close()


class CountingEnv:
    """The real shop environment, counting the executions the checker asks of it."""

    def __init__(self, env: Any) -> None:
        self._env, self.executed = env, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def execute(self, *args: Any) -> Any:
        self.executed += 1
        return self._env.execute(*args)


def test_a_check_costs_one_execution_at_any_depth():
    env = CountingEnv(get_environment("shop"))
    from pipeline.model import Rollout

    session = GuardSession(env, Rollout("r", "t", "shop"))  # type: ignore[arg-type]
    session.message("user", AVA)
    session.record(SIGN_IN)
    costs = []
    for _ in range(60):
        before = env.executed
        call = Call("get_user", {"user_id": "U1001"})
        session.check(call)
        session.record(call)
        costs.append(env.executed - before)
    assert costs == [1] * 60


def _linear_knows(texts: list[str], value: Any) -> bool:
    # The definition `History.knows` indexes: every text scanned.
    text = value if isinstance(value, str) else str(value)
    if not text:
        return False
    quoted = orjson.dumps(text).decode()
    word = re.compile(rf"(?<![\w.\-]){re.escape(text)}(?![\w\-]|\.\w)")
    return any(quoted in t for t in texts) or any(word.search(t) for t in texts)


WORDY = st.text(alphabet="ab1-._ @\"\\\né", max_size=12)


@given(st.lists(WORDY, max_size=6), st.lists(WORDY, min_size=1, max_size=6))
def test_the_indexed_history_knows_exactly_what_a_full_scan_finds(messages, values):
    history = History()
    for m in messages:
        history.add_message(m)
    for v in values:
        assert history.knows(v) == _linear_knows([m for m in messages if m], v), (messages, v)
