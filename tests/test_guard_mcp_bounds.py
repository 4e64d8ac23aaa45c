"""The MCP proxy, bounded and faithful: a real MCP client (the SDK) through `pexec guard mcp` to a real stdio
upstream (tests/mcp_upstream.py), each test one of the measured failures.

- live verdict = nightly verdict, check and cause included: `pexec score` of the proxy's log gives, step for
  step, the verdicts the proxy gave live (the spec's schema decides S for the tools it declares, the upstream's
  for the others, by the same rule on both sides);
- the upstream gets a minimal environment and what --env-allow names, less --env-deny in any case;
- the log is appended to, never rewritten;
- a silent upstream is a tool error after --upstream-timeout; a result over the line limit a tool error; an
  upstream's garbage a few lines on stderr, no traceback; a dead upstream is said on stderr and in the log;
- arguments nested deeper than the scorer reads are refused with its reason, at any depth, never a hang.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import duckdb
import orjson
import pytest
from test_guard_mcp import PEXEC, SAID, UPSTREAM, text

from pipeline.core.records import MAX_DEPTH
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings

if TYPE_CHECKING:  # the SDK is imported where a client is made (test_guard_mcp says why)
    from mcp import Client, StdioServerParameters

pytestmark = pytest.mark.fuzz  # an adversarial suite: `make fuzz` runs it too
TOO_DEEP = f"the record nests deeper than {MAX_DEPTH} levels"


def proxy(*args: str, upstream: list[str] = UPSTREAM, env: dict[str, str] | None = None, errlog: Any = None) -> Client:
    from mcp import Client, StdioServerParameters

    command = ["guard", "mcp", *args, "--", *upstream]
    params = StdioServerParameters(command=PEXEC, args=command, env=env or dict(os.environ))
    return Client(params) if errlog is None else Client(_with_errlog(params, errlog))


def _with_errlog(params: StdioServerParameters, errlog: Any) -> Any:
    from contextlib import asynccontextmanager

    from mcp.client.stdio import stdio_client

    @asynccontextmanager
    async def transport():  # the SDK's own stdio transport, the proxy's stderr into a file
        async with stdio_client(params, errlog=errlog) as streams:
            yield streams

    return transport()


def journal(log: Path) -> list[dict]:
    [path] = (log / ".journal").glob("*.jsonl")
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def rescored(log: Path, run: Path, spec: str | None = "support") -> list[tuple]:
    manifest = run_scoring(str(log), str(run), ScoreSettings(env="observed", spec=spec, inline=True))
    assert manifest.counts.rejected == 0
    query = f"SELECT valid, failed_check, cause FROM read_parquet('{run}/steps/*.parquet') ORDER BY step"
    return duckdb.sql(query).fetchall()


def live_verdicts(log: Path) -> list[tuple]:
    [path] = log.glob("*.jsonl")
    [record] = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    calls = [e for e in record["events"] if e["type"] == "call"]
    return [(c["guard"]["valid"], c["guard"]["check"], c["guard"]["cause"]) for c in calls]


async def call_all(client: Client, calls: list[tuple[str, dict, Any]]) -> list[tuple[bool, str]]:
    seen = []
    for name, arguments, meta in calls:
        result = await client.call_tool(name, arguments, meta=meta)
        seen.append((bool(result.is_error), text(result)))
    return seen


def test_the_rescore_of_a_guard_log_equals_the_live_verdicts_step_for_step(tmp_path):
    # Measured before: cancel_order of a shipped order with reason "late" (the upstream takes any string, the spec
    # an enum) was refused live as P and scored S by `pexec score --spec support` of the proxy's own log.
    log = tmp_path / "log"
    calls = [
        ("find_customer", {"email": "ava@example.com"}, SAID),
        ("list_orders", {"customer_id": "C100"}, None),
        ("get_order", {"order_id": "O2"}, None),
        ("cancel_order", {"order_id": "O2", "reason": "late"}, None),  # S: the spec's enum decides
        ("cancel_order", {"order_id": "O2", "reason": "too_slow"}, None),  # P: the spec's rule, O2 is shipped
        ("nap", {"seconds": "soon"}, None),  # S: a tool only the upstream declares, by its inputSchema
        ("nap", {"seconds": 0}, None),
        ("list_orders", {"customer_id": "C999"}, None),  # D: never seen
    ]

    async def session() -> list[tuple[bool, str]]:
        async with proxy("--spec", "support", "--log", str(log)) as client:
            return await call_all(client, calls)

    seen = anyio.run(session)
    assert seen[3][1].startswith("pexec guard refused cancel_order: S check failed (schema): data.reason must be one")
    assert seen[4][1].startswith("pexec guard refused cancel_order: P check failed (precondition)")
    assert seen[5][1].startswith("pexec guard refused nap: S check failed (schema)")
    live = live_verdicts(log)
    assert [v[1] for v in live] == [None, None, None, "S", "P", "S", None, "D"]
    assert rescored(log, tmp_path / "run") == live
    [record] = [orjson.loads(line) for line in next(log.glob("*.jsonl")).read_bytes().splitlines()]
    calls_logged = [e for e in record["events"] if e["type"] == "call"]
    assert [c["guard"]["schema"] for c in calls_logged] == ["spec"] * 5 + ["upstream"] * 2 + ["spec"]
    assert "cancel_order" not in record["env"]["tools"] and "nap" in record["env"]["tools"]


def test_without_a_spec_the_upstream_schemas_decide_and_the_rescore_agrees(tmp_path):
    log = tmp_path / "log"
    calls = [("find_customer", {"email": 5}, None), ("get_order", {"order_id": "O1"}, None), ("nope", {}, None)]

    async def session() -> list[tuple[bool, str]]:
        async with proxy("--log", str(log)) as client:
            return await call_all(client, calls)

    seen = anyio.run(session)
    assert [is_error for is_error, _ in seen] == [True, False, True]
    live = live_verdicts(log)
    assert (
        rescored(log, tmp_path / "run", spec=None)
        == live
        == [
            (False, "S", "schema"),
            (True, None, None),
            (False, "S", "schema"),
        ]
    )


def test_the_upstream_gets_a_minimal_environment_and_what_is_allowed(tmp_path):
    # Measured before: the upstream got all of the proxy's environment, pexec's tokens and AWS keys included.
    planted = {"PEXEC_TEST_SETTING": "on", "PEXEC_TEST_SECRET": "hunter2", "PEXEC_GUARD_TOKEN": "t0k"}
    env = {**os.environ, **planted, "AWS_SECRET_ACCESS_KEY": "aws-s3cret", "LC_ALL": "C.UTF-8"}
    names = ("PEXEC_TEST_SETTING", "PEXEC_TEST_SECRET", "PEXEC_GUARD_TOKEN", "AWS_SECRET_ACCESS_KEY", "HOME", "LC_ALL")

    async def read(*args: str) -> list[str]:
        async with proxy(*args, env=env) as client:
            return [text(await client.call_tool("read_env", {"name": n})) for n in names]

    home = os.environ["HOME"]
    assert anyio.run(read) == ["<unset>", "<unset>", "<unset>", "<unset>", home, "C.UTF-8"]
    allowed = anyio.run(read, "--env-allow", "PEXEC_TEST_*", "--env-allow", "AWS_*", "--env-deny", "*secret*")
    assert allowed == ["on", "<unset>", "<unset>", "<unset>", home, "C.UTF-8"]  # the deny in any case
    assert anyio.run(read, "--env-allow", "*")[:4] == ["on", "hunter2", "t0k", "aws-s3cret"]  # all, when asked


def test_a_misbehaving_upstream_is_bounded_and_its_log_appended_to(tmp_path):
    # Measured before: the log rewritten whole after every call (~9 GB written for 300 calls of 200 KB); a hung
    # upstream waited for ever; a 50 MB result cost 35-44 s; 100k junk lines became 88.9 MB of tracebacks; a dead
    # upstream left its tools advertised, nothing on stderr and the failed call missing from the log.
    from mcp import MCPError

    log, errors = tmp_path / "log", tmp_path / "stderr.txt"
    seen, journals = [], []
    calls = [
        ("nap", {"seconds": 60}),  # silent past --upstream-timeout
        ("nap", {"seconds": 0}),
        ("blob", {"size": 17_000_000}),  # over the 16 MiB message limit
        ("blob", {"size": 3, "pad": "p" * 50_000}),
        ("die", {"code": 3}),
        ("get_order", {"order_id": "O1"}),
    ]

    async def session() -> None:
        with errors.open("w") as errlog:
            upstream = [*UPSTREAM, "--junk", "100000"]
            async with proxy("--upstream-timeout", "4", "--log", str(log), upstream=upstream, errlog=errlog) as client:
                for name, arguments in calls:
                    began = time.perf_counter()
                    result = await client.call_tool(name, arguments)
                    seen.append((bool(result.is_error), text(result), time.perf_counter() - began))
                    [path] = (log / ".journal").glob("*.jsonl")
                    journals.append((path.stat().st_ino, path.read_bytes()))
                with pytest.raises(MCPError, match=r"exited \(code 3\)"):
                    await client.list_tools()
                assert not list(log.glob("*.jsonl"))  # the rollout is written once, at the end

    anyio.run(session)
    assert seen[0][:2] == (True, "the upstream did not answer nap within 4 s (--upstream-timeout)") and seen[0][2] < 15
    assert seen[1][:2] == (False, "awake")
    assert seen[2][0] and "the upstream's result is over 16777216 bytes" in seen[2][1] and seen[2][2] < 30
    assert seen[3][:2] == (False, "xxx")
    assert seen[4][0] and seen[5][:2] == (True, "the upstream MCP server exited (code 3): no tool can run")
    for (inode, data), (inode2, data2) in itertools.pairwise(journals):
        assert inode2 == inode and data2.startswith(data) and len(data2) - len(data) < 60_000  # one event more
    said = errors.read_text()
    assert "Traceback" not in said and len(said) < 5_000, said[:500]
    assert "the upstream wrote 100000 line(s) that are not JSON-RPC" in said and "\x1b" not in said
    assert "exited (code 3)" in said
    [path] = log.glob("*.jsonl")
    [record] = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [c["error"] for c in record["events"]] == [True, False, True, False, True, True]
    assert record["attributes"]["upstream_exit"] == "3" and not (log / ".journal" / path.name).exists()


class RawRpc:
    """JSON-RPC lines written to the proxy by hand: a client SDK cannot even serialise 300-level arguments."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.next_id = proc, 0

    def send(self, message: dict | bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((message if isinstance(message, bytes) else orjson.dumps(message)) + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict:
        assert self.proc.stdout is not None
        return orjson.loads(self.proc.stdout.readline())

    def handshake(self) -> None:
        params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
        assert "result" in self.answer()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, tool: str, arguments: Any = None, raw_arguments: str | None = None) -> dict:
        self.next_id += 1
        args = raw_arguments if raw_arguments is not None else orjson.dumps(arguments).decode()
        params = f'{{"name":"{tool}","arguments":{args}}}'
        line = f'{{"jsonrpc":"2.0","id":{self.next_id},"method":"tools/call","params":{params}}}'
        self.send(line.encode())
        return self.answer()


def test_deep_arguments_are_refused_at_any_depth_and_a_killed_proxys_journal_recovered(tmp_path):
    # Measured before: 100 levels forwarded as valid (while `pexec score` of the log rejected the rollout), 200+
    # levels never answered and nothing logged.
    log = tmp_path / "log"
    command = [PEXEC, "guard", "mcp", "--log", str(log), "--", *UPSTREAM]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        rpc = RawRpc(proc)
        rpc.handshake()
        for depth in (100, 300, 2000):
            nested = '{"order_id":"O1","x":' + "[" * depth + "]" * depth + "}"
            answer = rpc.call("get_order", raw_arguments=nested)
            assert answer["result"]["isError"] is True
            assert answer["result"]["content"][0]["text"] == f"pexec guard refused get_order: {TOO_DEEP}"
        result = rpc.call("get_order", {"order_id": "O1"})["result"]
        assert orjson.loads(result["content"][0]["text"])["order_id"] == "O1"
    finally:
        proc.kill()  # no clean end: the journal is all there is
        proc.wait(timeout=30)
    lines = journal(log)
    assert [line["note"]["reason"] for line in lines if "note" in line] == [TOO_DEEP] * 3
    assert not list(log.glob("*.jsonl"))

    async def next_session() -> None:
        async with proxy("--log", str(log)) as client:
            await client.list_tools()

    anyio.run(next_session)
    recovered = [orjson.loads(p.read_bytes()) for p in log.glob("*.jsonl")]
    assert sorted(len(r["events"]) for r in recovered) == [0, 1]  # the killed session's call; the new one's none
    assert rescored(log, tmp_path / "run", spec=None) == [(True, None, None)]
