"""The guard as an MCP proxy (`pexec guard mcp -- UPSTREAM…`): a stdio MCP server in front of an upstream
one (the official `mcp` SDK on both sides).

`tools/list` is forwarded. Each `tools/call` is checked first in the `observed` environment: S against the
tool's `inputSchema` from the upstream listing, D against the upstream's earlier results and the messages
the host passed along, P by a spec's `observed` rules (`--spec`, which also names the grounded
parameters). A call that fails is refused with a tool error that says why (`isError`) and never reaches
the upstream; a valid one is forwarded and its real result recorded. Every verdict is written to a
canonical rollout log that `pexec score --env observed` rescores.

The host may pass the conversation along in a call's `_meta` under `pexec/messages`: a list of
`{"role", "content"}` added before the call is checked (what D grounds values in).
"""

from __future__ import annotations

import os
import secrets
import shlex
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import orjson
from mcp import Client, MCPError, StdioServerParameters, stdio_server
from mcp.server.lowlevel.server import Server

from pipeline.core.errors import PexecError
from pipeline.core.model import Call, Rollout
from pipeline.core.records import event_record
from pipeline.envs import EnvOptions
from pipeline.envs.base import ToolInfo
from pipeline.envs.observed import ObservedEnvironment
from pipeline.envs.spec.loader import Spec, find_spec, load_spec
from pipeline.guard.session import GuardSession, GuardVerdict

MESSAGES_META = "pexec/messages"


class McpProxyError(PexecError):
    """The proxy cannot start (an upstream that does not answer, a spec that is not found)."""


def observed_environment(tools: list[types.Tool], spec: Spec | None) -> ObservedEnvironment:
    """`observed` with the upstream's schemas, and a spec's grounded parameters and `observed` rules."""
    rules = spec.tools if spec else {}
    catalogue = {}
    for tool in tools:
        grounded = rules[tool.name].info.grounded if tool.name in rules else frozenset()
        try:
            catalogue[tool.name] = ToolInfo.from_schema(tool.name, tool.input_schema, grounded)
        except PexecError as exc:
            raise McpProxyError(f"upstream tool {tool.name!r}: {exc}") from exc
    version = f"{spec.name}@{spec.version}+{spec.fingerprint}" if spec else "mcp"
    return ObservedEnvironment(catalogue, version, {n: r.observed for n, r in rules.items() if r.observed})


def refusal(verdict: GuardVerdict, tool: str) -> str:
    return f"pexec guard refused {tool}: {verdict.failed_check} check failed ({verdict.cause}): {verdict.detail}"


def result_output(result: types.CallToolResult) -> Any:
    """What the upstream returned, as a log records it: the structured content, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return texts[0] if len(texts) == 1 else "\n".join(texts)


class RolloutLog:
    """The session's canonical rollout, rewritten whole (atomically) after every verdict: one JSONL file
    per proxy session in the log folder, a store `pexec score --env observed` reads."""

    def __init__(self, folder: str, rollout: Rollout) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{rollout.rollout_id}.jsonl"

    def write(self, rollout: Rollout) -> None:
        record = {
            "rollout_id": rollout.rollout_id,
            "task_id": rollout.task_id,
            "benchmark": "observed",
            "labels": rollout.labels,
            "env": rollout.env,
            "events": [event_record(e) for e in rollout.events],
        }
        tmp = self.folder / f".{self.path.name}.tmp"  # dot files are not part of the store
        tmp.write_bytes(orjson.dumps(record) + b"\n")
        os.replace(tmp, self.path)


class GuardProxy:
    """The proxy's state: the upstream client, the guard session, the log."""

    def __init__(self, upstream: Client, tools: list[types.Tool], spec: Spec | None, log: str | None) -> None:
        self.upstream = upstream
        self.tools = tools
        rollout_id = f"mcp-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
        self.session = GuardSession(observed_environment(tools, spec), Rollout(rollout_id, rollout_id, "observed"))
        self.log = RolloutLog(log, self.session.rollout) if log else None
        self._calls = 0

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            messages = _messages(params.meta)
        except McpProxyError as exc:
            return types.CallToolResult(content=[types.TextContent(text=str(exc))], is_error=True)
        for message in messages:
            self.session.message(message["role"], message["content"])
        self._calls += 1
        call = Call(params.name, params.arguments or {}, call_id=f"c{self._calls}")
        verdict = self.session.check(call)
        if not verdict.valid:
            text = refusal(verdict, params.name)
            self.session.record(call, output=text, error=True)
            result = types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        else:
            result = await self.upstream.call_tool(params.name, params.arguments or {})
            self.session.record(call, output=result_output(result), error=bool(result.is_error))
        if self.log is not None:
            self.log.write(self.session.rollout)
        return result


def _messages(meta: Any) -> list[dict[str, str]]:
    raw = (meta or {}).get(MESSAGES_META)
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in raw
    ):
        raise McpProxyError(f"_meta[{MESSAGES_META!r}] must be a list of {{'role', 'content'}} strings")
    return raw


async def _list_all(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            return tools


async def serve_proxy(upstream: list[str], options: EnvOptions, log: str | None) -> None:
    spec = None
    if options.spec is not None:
        folder = find_spec(options.spec, options.spec_dirs)
        if folder is None:
            raise McpProxyError(f"no spec named {options.spec!r}")
        spec = load_spec(folder)
    async with AsyncExitStack() as stack:
        try:
            params = StdioServerParameters(command=upstream[0], args=upstream[1:])
            client = await stack.enter_async_context(Client(params))
            tools = await _list_all(client)
        except (OSError, MCPError, ExceptionGroup) as exc:  # the upstream did not start or does not speak MCP
            raise McpProxyError(f"upstream MCP server {shlex.join(upstream)!r}: {_reason(exc)}") from exc
        proxy = GuardProxy(client, tools, spec, log)
        server: Server[Any] = Server(
            "pexec-guard", version="1", on_list_tools=proxy.list_tools, on_call_tool=proxy.call_tool
        )
        read, write = await stack.enter_async_context(stdio_server())
        await server.run(read, write, server.create_initialization_options())


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def run_proxy(upstream: list[str], options: EnvOptions, log: str | None) -> None:
    """Serve on stdin/stdout until the client goes away."""
    if not upstream:
        raise McpProxyError("give the upstream MCP server's command after `--`")
    anyio.run(serve_proxy, upstream, options, log)
