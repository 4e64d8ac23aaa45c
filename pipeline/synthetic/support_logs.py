"""A production-style sample: OpenAI chat-completions logs of a customer-support agent (spec `support`),
one JSON Lines file per date partition, `DIR/date=YYYY-MM-DD/conversations.jsonl`.

    python -m pipeline.synthetic.support_logs --out DIR [--dates 2026-11-27,2026-11-28] [--per-date 40] [--seed 0]
        [--tools]

Each conversation is a customer goal (cancel, refund, address change, support ticket) played against a
small fixture backend, so outputs are consistent; some carry the failures production logs show: arguments
that are not JSON, an invented order id, cancelling a shipped order, a backend error, parallel calls in one
assistant message, a call whose result was never logged. Backend errors are tool messages whose content
starts with `Error:` (ingest with `--option error_prefix=Error:`). Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import gzip
import random
from pathlib import Path
from typing import Any

import orjson

MODELS = (("support-model-a", "v1.4"), ("support-model-b", "v1.5"))
# The failures each goal can show (the goal's calls must contain the failing call).
FAILURES = {
    "cancel": ("bad_json", "invented_id", "shipped_cancel", "no_result"),
    "refund": ("invented_id", "no_result"),
    "address": ("backend_error", "no_result"),
    "ticket": ("bad_json", "no_result"),
}
DEFAULT_DATES = ("2026-11-27", "2026-11-28", "2026-11-29")


class _Conversation:
    """Builds one chat-completions message list; call ids are sequential."""

    def __init__(self, user: str) -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are the support agent of an online shop. Use the tools."},
            {"role": "user", "content": user},
        ]
        self._n = 0

    def calls(self, *calls: tuple[str, Any, Any]) -> None:
        """One assistant message with these (tool, arguments, result) calls; result None = never logged."""
        batch = []
        for tool, args, _ in calls:
            self._n += 1
            text = args if isinstance(args, str) else orjson.dumps(args).decode()
            batch.append({"id": f"call_{self._n}", "type": "function", "function": {"name": tool, "arguments": text}})
        self.messages.append({"role": "assistant", "content": None, "tool_calls": batch})
        for tc, (_, _, result) in zip(batch, calls, strict=True):
            if result is not None:
                content = result if isinstance(result, str) else orjson.dumps(result).decode()
                self.messages.append({"role": "tool", "tool_call_id": tc["id"], "content": content})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def conversation(rng: random.Random, index: int, day: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One logged conversation (OpenAI format plus the logger's id, labels and success fields); `tools`: the
    request's tool definitions, logged with it when given."""
    model, version = MODELS[index % len(MODELS)]
    goal = rng.choice(sorted(FAILURES))
    failure = rng.choice(FAILURES[goal]) if rng.random() < (0.35 if index % 2 == 0 else 0.55) else None
    cid, name = f"C{100 + rng.randrange(900)}", rng.choice(("Ava Lopez", "Noah Kim", "Mia Chen", "Leo Rossi"))
    email = f"{name.split()[0].lower()}{cid[1:]}@example.com"
    order = f"O{rng.randrange(1000, 10000)}"
    tier = rng.choice(("silver", "gold"))
    c = _Conversation(f"Hi, I'm {name} ({email}). " + _ask(goal, order))
    c.calls(("find_customer", {"email": email}, {"customer_id": cid, "name": name, "tier": tier}))
    success = True
    if goal in ("cancel", "refund"):
        status = {"cancel": "processing", "refund": "delivered"}[goal]
        if failure == "shipped_cancel":
            status = "shipped"
        detail = {"order_id": order, "status": status, "total": 80.0, "customer_id": cid}
        if failure == "invented_id":
            c.calls(("get_order", {"order_id": "O0001"}, "Error: order O0001 not found"))
        c.calls(("list_orders", {"customer_id": cid}, [{"order_id": order, "status": status}]))
        profile = {"customer_id": cid, "name": name, "tier": tier}
        c.calls(("get_order", {"order_id": order}, detail), ("get_customer", {"customer_id": cid}, profile))
        if goal == "cancel":
            args = {"order_id": order, "reason": "changed_mind"}
            if failure == "bad_json":
                c.calls(("cancel_order", '{"order_id": "' + order + '", "reason": ', "Error: invalid arguments"))
            ok = status != "shipped"
            c.calls(("cancel_order", args, {"order_id": order, "status": "cancelled"} if ok else _shipped(order)))
            success = ok
        else:
            c.calls(("track_shipment", {"order_id": order}, {"carrier": "UPS", "delivered": True}))
            c.calls(("refund_order", {"order_id": order, "amount": 80.0, "reason": "damaged"}, {"refund_id": "R1"}))
    elif goal == "address":
        address = {"street": "12 Elm St", "city": "Austin", "zip": "78701"}
        if failure == "backend_error":
            c.calls(("update_address", {"customer_id": cid, "address": address}, "Error: address service unavailable"))
            success = False
        else:
            c.calls(("update_address", {"customer_id": cid, "address": address}, {"ok": True}))
            c.calls(("send_email", {"customer_id": cid, "template": "address_change"}, {"sent": True}))
    else:
        ticket = f"T{rng.randrange(100, 1000)}"
        c.calls(("search_kb", {"query": "damaged item"}, [{"article": "KB12", "title": "Damaged items"}]))
        c.calls(("create_ticket", {"customer_id": cid, "subject": "damaged item"}, {"ticket_id": ticket}))
        if failure == "bad_json":
            c.calls(("escalate_ticket", '{"ticket_id": ' + ticket + "}", "Error: invalid arguments"))
        c.calls(("escalate_ticket", {"ticket_id": ticket}, {"ticket_id": ticket, "status": "escalated"}))
    if failure == "no_result":
        c.calls(("apply_credit", {"customer_id": cid, "amount": 10}, None))  # the logger died before the result
        success = False
    else:
        c.say("Done. Anything else?")
    record: dict[str, Any] = {
        "id": f"{day}-{index:04d}",
        "task_id": f"{goal}-{failure or 'clean'}",
        "model": model,
        "agent_version": version,
        "date": day,
        "success": success,
        "messages": c.messages,
    }
    if tools is not None:
        record["tools"] = tools
    return record


def support_tools() -> list[dict[str, Any]]:
    """The support spec's tool definitions (specs/support/tools.json): what the agent's requests carry."""
    from pipeline.envs.data import BUILTIN_SPECS

    loaded: list[dict[str, Any]] = orjson.loads((BUILTIN_SPECS / "support" / "tools.json").read_bytes())
    return loaded


def _ask(goal: str, order: str) -> str:
    return {
        "cancel": "Please cancel my latest order.",
        "refund": f"Order {order} arrived damaged, I'd like a refund.",
        "address": "I moved: 12 Elm St, Austin 78701.",
        "ticket": "My blender arrived broken, can someone look into it?",
    }[goal]


def _shipped(order: str) -> str:
    return f"Error: order {order} has already shipped"


def write_samples(
    out: str | Path, dates: tuple[str, ...] = DEFAULT_DATES, per_date: int = 40, seed: int = 0, tools: bool = False
) -> list[Path]:
    """Write the sample logs; returns the files written (one per date). `tools`: each conversation logs the
    request's tool definitions."""
    given = support_tools() if tools else None
    written = []
    for day in dates:
        rng = random.Random(f"{seed}/{day}")
        folder = Path(out) / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "conversations.jsonl"
        path.write_bytes(b"".join(orjson.dumps(conversation(rng, i, day, given)) + b"\n" for i in range(per_date)))
        written.append(path)
    return written


def write_night(
    out: str | Path, conversations: int, files: int = 8, seed: int = 0, day: str = "2026-11-29", tools: bool = False
) -> list[Path]:
    """One night's conversations as a logger ships them: `files` gzip JSON Lines files, consecutive conversations
    in each (ids distinct across files); returns the files written. `tools`: each logs the request's tools."""
    given = support_tools() if tools else None
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}/{day}")
    per_file = -(-conversations // files)
    written = []
    for f in range(files):
        path = folder / f"conversations-{f:03d}.jsonl.gz"
        with gzip.open(path, "wb", compresslevel=6) as out_file:
            for index in range(f * per_file, min(conversations, (f + 1) * per_file)):
                out_file.write(orjson.dumps(conversation(rng, index, day, given)) + b"\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.synthetic.support_logs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder to write date=YYYY-MM-DD/ partitions into")
    parser.add_argument("--dates", default=",".join(DEFAULT_DATES), help="comma-separated YYYY-MM-DD")
    parser.add_argument("--per-date", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tools", action="store_true", help="log each request's tool definitions (`tools`)")
    args = parser.parse_args(argv)
    for path in write_samples(args.out, tuple(args.dates.split(",")), args.per_date, args.seed, args.tools):
        print(path)


if __name__ == "__main__":
    main()
