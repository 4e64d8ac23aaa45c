"""`pexec synth`: synthetic stores with known truth, for tests, demos and benchmarks.

Each task is a customer goal on the `shop` spec; its gold trajectory is run through the spec environment
once (so logged outputs are real). Each rollout of a task belongs to a condition (model × method) and may
get an invalid call injected at a chosen depth for one of the five causes, then either recover (the rest of
the gold trajectory, success) or give up. The expected per-step truth is recorded in every record.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from pipeline.core.errors import SynthError
from pipeline.core.model import CAUSES, Call, Rollout
from pipeline.core.records import EventRecord, RolloutRecord
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.envs.spec.loader import find_spec

# condition -> (probability of an invalid call, probability of recovering after one)
CONDITIONS: dict[tuple[str, str], tuple[float, float]] = {
    ("model-a", "react"): (0.55, 0.75),
    ("model-a", "plan_execute"): (0.35, 0.70),
    ("model-b", "react"): (0.80, 0.80),
    ("model-b", "plan_execute"): (0.60, 0.55),
}
MUTATING = {"cancel_order", "return_items", "apply_coupon"}  # repeating one is a state_consistency error


class StepTruth(TypedDict):
    valid: bool
    cause: str | None  # the injected failure's cause label; None for a valid call


class Truth(TypedDict):
    """What every synthetic record carries as `truth`: the expected result of scoring it."""

    fed: int
    first_cause: str | None
    steps: list[StepTruth]


@dataclass
class _Step:
    tool: str
    args: Any
    valid: bool = True
    cause: str | None = None
    output: Any = None


@dataclass
class _Task:
    task_id: str
    message: str
    gold: list[_Step]


def synthesize(
    spec: str = "shop",
    n_rollouts: int = 1000,
    n_tasks: int = 100,
    seed: int = 0,
    options: Mapping[str, str] | None = None,
) -> Iterator[RolloutRecord]:
    """Canonical rollout records with a `truth` field, `n_rollouts` of them over `n_tasks` tasks: on the `shop`
    spec, on τ telecom's official tasks and environment (`tau_telecom`, both actors: pipeline.synthetic.telecom),
    or on a τ source's banking_knowledge tasks and code (`tau_banking_knowledge`: `options` name the source,
    `tau2_source` and `tau2_python`; pipeline.synthetic.banking)."""
    options = options or {}
    if spec != "tau_banking_knowledge" and options:
        raise SynthError(f"synth {spec} takes no --option (only tau_banking_knowledge: tau2_source, tau2_python)")
    if spec == "tau_telecom":
        from pipeline.synthetic.telecom import synthesize_telecom

        yield from synthesize_telecom(n_rollouts, n_tasks, seed)
        return
    if spec == "tau_banking_knowledge":
        from pipeline.synthetic.banking import synthesize_banking

        unknown = sorted(set(options) - {"tau2_source", "tau2_python"})
        if unknown:
            raise SynthError(
                f"synth tau_banking_knowledge: unknown option(s) {', '.join(unknown)} (known: tau2_python, tau2_source)"
            )
        yield from synthesize_banking(n_rollouts, n_tasks, seed, options)
        return
    if spec != "shop":
        raise SynthError(
            f"synth knows how to build tasks for the 'shop' spec, tau_telecom and tau_banking_knowledge only, "
            f"not {spec!r}"
        )
    folder = find_spec(spec)
    if folder is None:
        raise SynthError("the 'shop' spec is not installed (specs/shop)")
    env = SpecEnvironment.from_folder(folder)
    n_tasks = min(n_tasks, n_rollouts)  # a task without rollouts would never be seen
    tasks = [_make_task(env, i, random.Random(f"{seed}/task/{i}")) for i in range(n_tasks)]
    conditions = sorted(CONDITIONS)
    for r in range(n_rollouts):
        task = tasks[r % n_tasks]
        model, method = conditions[(r // n_tasks) % len(conditions)]
        rng = random.Random(f"{seed}/rollout/{r}")
        yield _rollout_record(f"r{r:07d}", task, model, method, rng)


def _make_task(env: SpecEnvironment, index: int, rng: random.Random) -> _Task:
    db = env.spec.initial_state
    user = db["users"][rng.choice(sorted(db["users"]))]
    orders = [db["orders"][o] for o in user["orders"]]
    by_status = {s: [o for o in orders if o["status"] == s] for s in ("pending", "delivered")}
    goals = ["order", "address", "status"] + ["cancel", "coupon"] * bool(by_status["pending"])
    goals += ["return"] * bool(by_status["delivered"])
    goal = rng.choice(goals)
    uid = user["user_id"]
    gold = [_Step("authenticate", {"email": user["email"], "zip": user["zip"]}), _Step("get_user", {"user_id": uid})]
    ask = ""
    for other in rng.sample(user["orders"], rng.randint(0, len(user["orders"]))):
        gold.append(_Step("get_order", {"order_id": other}))  # the agent looks around first
    browsed = rng.sample(sorted(db["products"]), rng.randint(0, 5))
    if browsed:
        gold.append(_Step("list_products", {}))
        gold += [_Step("get_product", {"product_id": p}) for p in browsed]
    if goal in ("cancel", "coupon", "status"):
        order = rng.choice(by_status["pending"] if goal != "status" else orders)
        oid = order["order_id"]
        gold.append(_Step("get_order", {"order_id": oid}))
        if goal == "cancel":
            gold.append(_Step("cancel_order", {"order_id": oid, "reason": "no longer needed"}))
            ask = f"please cancel my order {oid}"
        elif goal == "coupon":
            code = rng.choice(sorted(db["coupons"]))
            gold.append(_Step("apply_coupon", {"order_id": oid, "code": code}))
            ask = f"I have the coupon {code} for order {oid}"
        else:
            gold += [_Step("get_product", {"product_id": i["product_id"]}) for i in order["items"]]
            ask = f"what is the status of order {oid}?"
    elif goal == "return":
        order = rng.choice(by_status["delivered"])
        pid = order["items"][0]["product_id"]
        gold += [_Step("get_order", {"order_id": order["order_id"]}), _Step("get_product", {"product_id": pid})]
        gold.append(_Step("return_items", {"order_id": order["order_id"], "product_ids": [pid]}))
        ask = f"I want to return the {db['products'][pid]['name']} from order {order['order_id']}"
    elif goal == "order":
        stocked = [p for p in sorted(db["products"]) if db["products"][p]["stock"] >= 2]
        pid = rng.choice(stocked)
        card = next(iter(user["payment_methods"]))
        gold += [_Step("list_products", {}), _Step("get_product", {"product_id": pid})]
        gold.append(
            _Step(
                "place_order",
                {"user_id": uid, "items": [{"product_id": pid, "quantity": 1}], "payment_method_id": card},
            )
        )
        ask = f"I'd like to buy one {db['products'][pid]['name']}"
    else:
        gold.append(_Step("update_address", {"user_id": uid, "street": "12 Elm Rd", "city": "Austin", "zip": "78702"}))
        gold.append(_Step("get_user", {"user_id": uid}))
        ask = "I moved to 12 Elm Rd, Austin 78702"
    message = f"Hi, I'm {user['name']} ({user['email']}, zip {user['zip']}). {ask}"
    task = _Task(f"shop-{index:05d}", message, gold)
    _run_gold(env, task)
    return task


def _run_gold(env: SpecEnvironment, task: _Task) -> None:
    rollout = Rollout(rollout_id="gold", task_id=task.task_id, benchmark="shop")
    state = env.start(rollout)
    for step in task.gold:
        outcome = env.execute(state, step.tool, step.args, Call(step.tool, step.args))
        if not outcome.accepted:
            raise AssertionError(f"{task.task_id}: gold call {step.tool} rejected: {outcome.message}")
        step.output = outcome.output


def _rollout_record(rollout_id: str, task: _Task, model: str, method: str, rng: random.Random) -> RolloutRecord:
    p_fail, p_recover = CONDITIONS[(model, method)]
    steps = list(task.gold)
    success = rng.random() < 0.95
    if rng.random() < p_fail:
        cause = rng.choice(CAUSES)
        depth = _inject(steps, cause, task, rng, first=True)
        if rng.random() < p_recover:
            if rng.random() < 0.3:  # a later invalid call after the first one
                later = rng.choice(("schema", "dependency", "information", "precondition"))
                _inject(steps, later, task, rng, first=False, after=depth)
        else:
            steps = steps[:depth]
            success = False
    events: list[EventRecord] = [{"type": "message", "role": "user", "content": task.message, "turn": 0}]
    for step in steps:
        output, error = (step.output, False) if step.valid else ("Error", True)
        events.append(
            {"type": "call", "tool": step.tool, "arguments": step.args, "turn": 0, "output": output, "error": error}
        )
    events.append({"type": "message", "role": "assistant", "content": "Done.", "turn": 0})
    truth: list[StepTruth] = [{"valid": s.valid, "cause": s.cause} for s in steps]
    fed = next((i + 1 for i, s in enumerate(steps) if not s.valid), len(steps) + 1)
    known: Truth = {"fed": fed, "first_cause": truth[fed - 1]["cause"] if fed <= len(steps) else None, "steps": truth}
    return {
        "rollout_id": rollout_id,
        "task_id": task.task_id,
        "benchmark": "shop",
        "labels": {"model": model, "method": method},
        "env": {},
        "events": events,
        "success": success,
        "cost": {"tokens": 400 * len(steps) + rng.randint(0, 400), "latency_s": round(0.8 * len(steps), 2)},
        "truth": known,
    }


def _inject(steps: list[_Step], cause: str, task: _Task, rng: random.Random, *, first: bool, after: int = 0) -> int:
    """Insert an invalid call for `cause`; returns its depth (1-based). Later failures get cheap labels."""
    uid = task.gold[1].args["user_id"]
    mutations = [i for i, s in enumerate(steps) if s.tool in MUTATING and s.valid]
    if cause == "state_consistency" and not mutations:
        cause = "precondition"
    if cause == "state_consistency":
        source = mutations[0]
        pos = rng.randint(max(source + 1, after), len(steps))
        step = _Step(steps[source].tool, steps[source].args, valid=False)
    elif cause == "precondition":
        signed_in = next(i for i, s in enumerate(steps) if s is task.gold[0]) + 1  # the user id is known
        pos = rng.randint(max(signed_in, after), len(steps))
        step = _Step(
            "update_address", {"user_id": uid, "street": "1 Nowhere", "city": "Austin", "zip": "ABCDE"}, valid=False
        )
    else:
        pos = rng.randint(after, len(steps))
        step = _Step(*_bad_call(cause, rng, pos), valid=False)
    step.cause = cause if first or cause in ("schema", "dependency", "information") else "precondition"
    steps.insert(pos, step)
    return pos + 1


def _bad_call(cause: str, rng: random.Random, pos: int) -> tuple[str, Any]:
    if cause == "schema":
        return rng.choice(
            [
                ("lookup_order", {"order_id": "O5001"}),  # no such tool
                ("cancel_order", {"order_id": "O5001"}),  # a required argument is missing
                ("get_order", {"order_id": 5001}),  # wrong type
                ("cancel_order", {"order_id": "O5001", "reason": "changed my mind"}),  # not in the enum
                ("get_order", '{"order_id": "O5001"'),  # arguments that do not parse
            ]
        )
    if cause == "dependency":
        return rng.choice(
            [
                ("get_order", {"order_id": {"$ref": f"step{pos + 3}.order_id"}}),  # a step not yet run
                ("get_order", {"order_id": {"$ref": "step1.tracking_number"}}),  # a field that is not there
                ("get_order", {"order_id": "{{shipment.order_id}}"}),  # a placeholder nothing fills
            ]
        )
    return ("get_order", {"order_id": f"O{rng.randint(7000, 7999)}"})  # information: an invented id
