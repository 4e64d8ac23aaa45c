"""The S/D/P checker and the cause labels on the shipped `shop` spec, with hand-written rollouts."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.model import Call, Message, Rollout, RolloutResult
from pipeline.envs import get_environment
from pipeline.replay.checker import replay

AVA = "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701)."
SIGN_IN = ("authenticate", {"email": "ava.lopez@example.com", "zip": "78701"})


def run(*events: Any, message: str = AVA, env: str = "shop") -> RolloutResult:
    evs: list[Message | Call] = [Message("user", message)]
    for e in events:
        if isinstance(e, Message):
            evs.append(e)
        else:
            tool, args, *rest = e
            evs.append(Call(tool, args, **(rest[0] if rest else {})))
    return replay(get_environment(env), Rollout("r", "t", "shop", events=evs, success=True))


def flags(result: RolloutResult) -> list[tuple[bool, str | None, str | None]]:
    return [(s.valid, s.failed_check, s.cause) for s in result.steps]


@pytest.fixture(scope="module")
def ava() -> dict[str, Any]:
    return get_environment("shop").spec.initial_state["users"]["U1001"]


def pending(ava: dict[str, Any]) -> str:
    orders = get_environment("shop").spec.initial_state["orders"]
    return next(o for o in ava["orders"] if orders[o]["status"] == "pending")


def not_pending(ava: dict[str, Any]) -> str:
    orders = get_environment("shop").spec.initial_state["orders"]
    return next(o for o in ava["orders"] if orders[o]["status"] != "pending")


def test_gold_path_is_fully_executable(ava):
    oid = pending(ava)
    result = run(
        SIGN_IN,
        ("get_user", {"user_id": "U1001"}),
        ("get_order", {"order_id": oid}),
        ("cancel_order", {"order_id": oid, "reason": "no longer needed"}),
    )
    assert flags(result) == [(True, None, None)] * 4
    assert result.fed == 5 and result.executable and result.auc_term == 1.0
    assert all(s.prefix_executable for s in result.steps)


@pytest.mark.parametrize(
    ("call", "detail"),
    [
        (("lookup_order", {"order_id": "O5001"}), "unknown tool 'lookup_order'"),
        (("get_order", {}), "must contain ['order_id'] properties"),
        (("get_order", {"order_id": 5001}), "must be string"),
        (("get_order", {"order_id": "O5001", "verbose": True}), "must not contain"),
        (("cancel_order", {"order_id": "O5001", "reason": "bored"}), "must be one of"),
        (("get_order", '{"order_id": "O5001"'), "arguments do not parse as JSON"),
        (("get_order", "[1, 2]"), "arguments must be an object"),
    ],
)
def test_schema_failures(call, detail):
    result = run(SIGN_IN, call)
    assert flags(result)[1] == (False, "S", "schema")
    assert detail in result.steps[1].detail


def test_schema_is_checked_before_dependency():
    # A broken reference AND an unknown argument: S is the first rule that matches.
    result = run(SIGN_IN, ("get_order", {"order_id": {"$ref": "step9.order_id"}, "extra": 1}))
    assert flags(result)[1] == (False, "S", "schema")


def test_references_resolve_to_earlier_outputs(ava):
    result = run(
        SIGN_IN,
        ("get_user", {"user_id": {"$ref": "step1.user_id"}}),
        ("get_order", {"order_id": "$step2.orders[0]"}),
        ("get_user", {"user_id": "{{user_id}}"}),
        ("get_order", {"order_id": "<order_id>"}),
    )
    assert flags(result) == [(True, None, None)] * 5


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        ({"order_id": {"$ref": "step5.order_id"}}, "step 5 is not before step 2"),
        ({"order_id": {"$ref": "step1.tracking"}}, "no field 'tracking'"),
        ({"order_id": "{{shipment.id}}"}, "no earlier successful output has a field 'shipment'"),
        ({"order_id": "<order_id>"}, "no earlier successful output has a field 'order_id'"),
    ],
)
def test_dependency_failures(args, detail):
    result = run(SIGN_IN, ("get_order", args))
    assert flags(result)[1] == (False, "D", "dependency")
    assert detail in result.steps[1].detail


def test_reference_to_a_failed_step_and_of_the_wrong_type():
    failed = run(SIGN_IN, ("get_user", {"user_id": "U1001", "x": 1}), ("get_user", {"user_id": "$step2.user_id"}))
    assert flags(failed)[2] == (False, "D", "dependency") and "step 2 failed" in failed.steps[2].detail
    typed = run(SIGN_IN, ("get_user", {"user_id": "U1001"}), ("get_order", {"order_id": {"$ref": "step2.orders"}}))
    assert flags(typed)[2] == (False, "D", "dependency") and "does not fit" in typed.steps[2].detail


def test_invented_grounded_value_is_information():
    result = run(SIGN_IN, ("get_order", {"order_id": "O7777"}))
    assert flags(result)[1] == (False, "D", "information")
    # ...and the same id becomes usable once a message mentions it (then the simulator decides).
    told = run(SIGN_IN, Message("user", "my order is O7777"), ("get_order", {"order_id": "O7777"}))
    assert flags(told)[1] == (False, "P", "precondition")
    assert told.steps[1].detail == "order O7777 not found"


def test_state_consistency_vs_precondition(ava):
    oid = pending(ava)
    cancel = ("cancel_order", {"order_id": oid, "reason": "no longer needed"})
    twice = run(SIGN_IN, ("get_user", {"user_id": "U1001"}), cancel, cancel)
    assert flags(twice)[3] == (False, "P", "state_consistency")
    assert "only pending orders" in twice.steps[3].detail
    never = run(
        SIGN_IN,
        ("get_user", {"user_id": "U1001"}),
        ("cancel_order", {"order_id": not_pending(ava), "reason": "no longer needed"}),
    )
    assert flags(never)[2] == (False, "P", "precondition")


def test_invalid_calls_leave_the_state_unchanged_and_replay_continues(ava):
    oid = pending(ava)
    result = run(
        SIGN_IN,
        ("get_user", {"user_id": "U1001"}),
        ("cancel_order", {"order_id": oid, "reason": "bored"}),  # S: not executed
        ("get_order", {"order_id": oid}),
        ("cancel_order", {"order_id": oid, "reason": "ordered by mistake"}),
        ("cancel_order", {"order_id": oid, "reason": "ordered by mistake"}),
    )
    assert [s.valid for s in result.steps] == [True, True, False, True, True, False]
    assert result.fed == 3 and result.first_cause == "schema"
    # Later invalid steps carry the cheap label: precondition, not state_consistency.
    assert flags(result)[5] == (False, "P", "precondition")
    assert [s.prefix_executable for s in result.steps] == [True, True, False, False, False, False]


def test_state_consistency_check_restores_the_state(ava):
    # After the re-tests against earlier states, the current state must be exactly as before.
    oid = pending(ava)
    cancel = ("cancel_order", {"order_id": oid, "reason": "no longer needed"})
    result = run(
        SIGN_IN, ("get_user", {"user_id": "U1001"}), cancel, cancel, ("get_order", {"order_id": oid}, {"output": None})
    )
    assert result.steps[3].cause == "state_consistency"
    assert result.steps[4].valid
    env = get_environment("shop")
    assert env._state.doc["orders"][oid]["status"] == "cancelled"


def test_precondition_on_first_call_has_no_earlier_state():
    result = run(("get_user", {"user_id": "U1001"}), message="I am U1001")
    assert flags(result) == [(False, "P", "precondition")]
    assert result.steps[0].detail == "authenticate as U1001 first"


def test_output_match():
    env = get_environment("shop")
    logged = {"user_id": "U1001"}
    good = run(("authenticate", SIGN_IN[1], {"output": logged}))
    assert good.steps[0].output_match is True
    as_text = run(("authenticate", SIGN_IN[1], {"output": '{"user_id": "U1001"}'}))
    assert as_text.steps[0].output_match is True
    drift = run(("authenticate", SIGN_IN[1], {"output": {"user_id": "U9"}}))
    assert drift.steps[0].output_match is False
    unlogged = run(SIGN_IN)
    assert unlogged.steps[0].output_match is None
    rejected = run(("get_order", {"order_id": "O5001"}, {"output": "Error", "error": True}), message="O5001")
    assert rejected.steps[0].output_match is True
    assert env.simulated


def test_no_calls_is_vacuously_executable():
    result = run()
    assert result.T == 0 and result.fed == 1 and result.executable and result.auc_term == 1.0


def test_observed_environment_uses_the_logged_error():
    result = run(
        ("anything", {"x": 1}, {"output": "ok", "error": False}),
        ("other", {"y": 2}, {"output": "backend said no", "error": True}),
        env="observed",
    )
    assert flags(result) == [(True, None, None), (False, "P", "precondition")]
    assert result.steps[1].decided_by == "log" and result.steps[1].detail == "backend said no"
    assert result.steps[0].output_match is None  # no simulator: nothing to compare


def test_a_users_calls_share_the_state_but_not_the_agents_prefix(ava):
    # Dual control: the user's call runs on the same state in logged order; the agent's call it made impossible is
    # state_consistency naming the user's step, and the user's steps are counted and scored on their own.
    oid = pending(ava)
    reason = {"order_id": oid, "reason": "no longer needed"}
    result = run(
        SIGN_IN,
        ("get_user", {"user_id": "U1001"}),
        Message("assistant", f"You can cancel order {oid} yourself."),  # what the user's call is grounded in
        ("cancel_order", reason, {"actor": "user"}),
        ("get_order", {"order_id": "nope"}, {"actor": "user"}),
        ("cancel_order", reason),
    )
    assert [(s.actor, s.step, s.seq) for s in result.all_steps] == [
        ("agent", 1, 1),
        ("agent", 2, 2),
        ("user", 1, 3),
        ("user", 2, 4),
        ("agent", 3, 5),
    ]
    assert result.T == 3 and result.fed == 3 and result.first_cause == "state_consistency"
    assert result.steps[2].detail.endswith("made impossible by the user's step 1 (cancel_order)")
    assert [s.valid for s in result.user_steps] == [True, False] and result.user_fed == 2
    assert [s.prefix_executable for s in result.steps] == [True, True, False]
    # The agent's own earlier call makes no other-actor note.
    own = run(SIGN_IN, ("get_user", {"user_id": "U1001"}), ("cancel_order", reason), ("cancel_order", reason))
    assert own.steps[3].cause == "state_consistency" and "made impossible" not in own.steps[3].detail
    assert own.user_steps == [] and own.user_fed is None and own.all_steps == own.steps


# -- what a detail quotes ---------------------------------------------------------------------------------------------

BIG = "x" * 1_000_000


def test_a_long_argument_is_quoted_in_a_grounding_detail_to_a_bounded_length():
    rollout = Rollout("r", "t", "shop", events=[Message("user", "hi"), Call("get_order", {"order_id": BIG})])
    [step] = replay(get_environment("shop"), rollout).steps
    assert (step.failed_check, step.cause) == ("D", "information")
    quoted = "'" + "x" * 199 + f"… ({len(BIG) + 2 - 200:,} more characters)"  # repr's quotes counted
    assert step.detail == f"order_id={quoted} occurs in no earlier output or message"


def test_a_simulators_long_message_is_kept_to_the_detail_limit_with_what_was_cut_counted():
    from pipeline.replay.checker import MAX_DETAIL_CHARS

    rollout = Rollout("r", "t", "shop", events=[Message("user", "hi"), Call("get_order", {"order_id": BIG})])
    [step] = replay(get_environment("shop"), rollout, ("schema", "precondition")).steps
    assert step.failed_check == "P" and step.detail is not None
    kept, cut = step.detail.split("… (")
    assert len(kept) == MAX_DETAIL_CHARS and BIG[:100] in kept
    assert cut.endswith(" more characters)") and int(cut.split()[0].replace(",", "")) > len(BIG) - MAX_DETAIL_CHARS


def test_the_guard_quotes_a_long_argument_as_the_scorer_does():
    from pipeline.apps.guard.replay import rule_of
    from pipeline.apps.guard.session import open_session

    rollout = Rollout("r", "t", "shop", events=[Message("user", "hi"), Call("get_order", {"order_id": BIG})])
    [scored] = replay(get_environment("shop"), rollout).steps
    session = open_session("shop")
    try:
        verdict = session.check(Call("get_order", {"order_id": BIG}))
    finally:
        session.close()
    assert verdict.detail == scored.detail and len(verdict.detail or "") < 300
    assert rule_of(verdict) == "D information (grounded order_id)"
