"""The guard's MCP proxy: a real MCP client session (the SDK's stdio client) through `pexec guard mcp` to a
real upstream MCP server (tests/mcp_upstream.py), and the proxy's rollout log rescored by `pexec score`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import duckdb
import orjson

from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings

PEXEC = str(Path(sys.executable).parent / "pexec")
UPSTREAM = [sys.executable, str(Path(__file__).parent / "mcp_upstream.py")]
SAID = {"pexec/messages": [{"role": "user", "content": "Hi, I'm ava@example.com"}]}
# The MCP SDK is imported where a client is made, not when the suite is collected (half a second in each worker).
if TYPE_CHECKING:
    from mcp import Client


def proxy(*args: str) -> Client:
    from mcp import Client, StdioServerParameters

    # This checkout's pexec: the SDK passes a server only a few environment variables unless told.
    command = ["guard", "mcp", *args, "--", *UPSTREAM]
    return Client(StdioServerParameters(command=PEXEC, args=command, env=dict(os.environ)))


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


async def conversation(log: Path) -> list[tuple[bool, str]]:
    """(refused, text) of each call, in order."""
    seen = []
    async with proxy("--spec", "support", "--log", str(log)) as client:
        tools = (await client.list_tools()).tools
        assert {"cancel_order", "find_customer", "get_order", "list_orders"} <= {t.name for t in tools}
        assert tools[0].input_schema["type"] == "object"
        calls: list[tuple[str, dict[str, Any], Any]] = [
            ("list_orders", {"customer_id": "C100"}, None),  # D: C100 occurs nowhere yet
            ("find_customer", {"email": 5}, None),  # S: the upstream schema says string
            ("find_customer", {"email": "ava@example.com"}, SAID),
            ("list_orders", {"customer_id": "C100"}, None),  # grounded in find_customer's result now
            ("get_order", {"order_id": "O2"}, None),
            ("cancel_order", {"order_id": "O2", "reason": "too_slow"}, None),  # P: the spec's rule, O2 was shipped
            ("get_order", {"order_id": "O2"}, None),  # the refused cancellation never reached the upstream
            ("get_order", {"order_id": "O1"}, None),
            ("cancel_order", {"order_id": "O1", "reason": "too_slow"}, None),
        ]
        for name, arguments, meta in calls:
            result = await client.call_tool(name, arguments, meta=meta)
            seen.append((result.is_error, text(result)))
    return seen


def test_the_proxy_refuses_invalid_calls_and_logs_every_verdict(tmp_path):
    log = tmp_path / "log"
    seen = anyio.run(conversation, log)
    refused = [i for i, (is_error, _) in enumerate(seen) if is_error]
    assert refused == [0, 1, 5]
    assert seen[0][1].startswith("pexec guard refused list_orders: D check failed (information): customer_id='C100'")
    assert seen[1][1].startswith("pexec guard refused find_customer: S check failed (schema): data.email must be")
    assert seen[5][1] == (
        "pexec guard refused cancel_order: P check failed (precondition): order O2 is shipped: only pending or "
        "processing orders can be cancelled"
    )  # checked before it ran: there is no log to contradict
    assert orjson.loads(seen[6][1])["status"] == "shipped"
    assert orjson.loads(seen[8][1]) == {"order_id": "O1", "status": "cancelled"}

    [path] = log.glob("*.jsonl")
    [record] = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    calls = [e for e in record["events"] if e["type"] == "call"]
    assert len(calls) == 9 and [c["error"] for c in calls] == [i in refused for i in range(9)]
    assert [e["content"] for e in record["events"] if e["type"] == "message"] == [SAID["pexec/messages"][0]["content"]]

    run = tmp_path / "run"
    manifest = run_scoring(str(log), str(run), ScoreSettings(env="observed", spec="support", inline=True))
    assert manifest.counts.rejected == 0
    rows = duckdb.sql(f"SELECT valid, failed_check, cause FROM read_parquet('{run}/steps/*.parquet') ORDER BY step")
    assert rows.fetchall() == [
        (False, "D", "information"),
        (False, "S", "schema"),
        (True, None, None),
        (True, None, None),
        (True, None, None),
        (False, "P", "precondition"),
        (True, None, None),
        (True, None, None),
        (True, None, None),
    ]


def test_the_proxy_needs_an_upstream_command():
    result = subprocess.run([PEXEC, "guard", "mcp"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Missing argument" in result.stderr
