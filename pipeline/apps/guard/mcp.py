"""The guard as an MCP proxy (`pexec guard mcp -- UPSTREAM…`): a stdio MCP server in front of an upstream
one (the official `mcp` SDK on both sides, over the bounded pipes of pipeline.apps.guard.upstream).

`tools/list` is forwarded. Each `tools/call` is checked first in the `observed` environment: S against the
tool's schema, D against the upstream's earlier results and the messages the host passed along, P by a spec's
`observed` rules (`--spec`, which also names the grounded parameters). A call that fails is refused with a
tool error that says why (`isError`) and never reaches the upstream; a valid one is forwarded (within
`--upstream-timeout`) and its real result recorded.

Which schema decides S: the spec's, for every tool the spec declares; the upstream's `inputSchema` for the
others (and for every tool without a spec). The log's rollout carries those upstream schemas in `env.tools`,
which `pexec score --env observed` reads by the same rule, so the rescore of a log gives the live verdicts step
for step; each call in the log also keeps its live verdict under `guard` (valid, check, cause, and the
schema used: `spec` or `upstream`).

The log (`--log FOLDER`) is an append-only journal, turned into the canonical rollout once at the end
(pipeline.apps.guard._journal).

The host may pass the conversation along in a call's `_meta` under `pexec/messages`: a list of
`{"role", "content"}` added before the call is checked (what D grounds values in).
"""

from __future__ import annotations

import secrets
import shlex
import time
from contextlib import AsyncExitStack
from typing import Any, Literal

import anyio
import mcp.types as types
from mcp import Client, MCPError, stdio_server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from pipeline.apps.guard._journal import LiveVerdict, RolloutLog
from pipeline.apps.guard.session import GuardSession, GuardVerdict, SessionBudget
from pipeline.apps.guard.upstream import (
    MAX_LINE,
    REFUSED_TOOL,
    HostRequests,
    UpstreamState,
    UpstreamTransport,
    upstream_environment,
)
from pipeline.core.errors import InvalidRecord, McpProxyError, SessionFull
from pipeline.core.model import Call, Message, Rollout
from pipeline.envs import EnvOptions
from pipeline.envs.observed import ObservedEnvironment
from pipeline.envs.spec.loader import Spec, find_spec, load_spec

MESSAGES_META = "pexec/messages"
UPSTREAM_TIMEOUT = 60.0  # seconds a forwarded call may wait for the upstream's answer
MAX_RESULT = MAX_LINE  # bytes of one upstream result (its JSON-RPC message)
# The proxy's one session lasts as long as the host's connection: a larger budget than an HTTP session's.
MCP_BUDGET = SessionBudget(max_events=100_000, max_bytes=256 * 1024 * 1024)
Context = ServerRequestContext[Any, Any]  # a request's context in the SDK's server (the proxy reads none of it)


def observed_environment(spec: Spec | None) -> ObservedEnvironment:
    """`observed` with a spec's schemas, grounded parameters and `observed` rules (the upstream's schemas come
    with the session's rollout, `env.tools`)."""
    if spec is None:
        return ObservedEnvironment(None, "mcp")
    version = f"{spec.name}@{spec.version}+{spec.fingerprint}"
    return ObservedEnvironment(
        {n: r.info for n, r in spec.tools.items()},
        version,
        {n: r.observed for n, r in spec.tools.items() if r.observed},
    )


def upstream_schemas(tools: list[types.Tool], spec: Spec | None) -> dict[str, dict[str, Any]]:
    """The upstream schemas that decide S: those of the tools the spec does not declare."""
    declared = spec.tools if spec else {}
    return {t.name: t.input_schema for t in tools if t.name not in declared}


def refusal(verdict: GuardVerdict, tool: str) -> str:
    return f"pexec guard refused {tool}: {verdict.failed_check} check failed ({verdict.cause}): {verdict.detail}"


def result_output(result: types.CallToolResult) -> Any:
    """What the upstream returned, as a log records it: the structured content, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return texts[0] if len(texts) == 1 else "\n".join(texts)


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


class GuardProxy:
    """The proxy's state: the upstream client, the guard session, the log."""

    def __init__(
        self,
        upstream: Client,
        state: UpstreamState,
        tools: list[types.Tool],
        spec: Spec | None,
        log: str | None,
        timeout: float = UPSTREAM_TIMEOUT,
        budget: SessionBudget | None = None,
    ) -> None:
        self.upstream, self.upstream_state, self.tools, self.timeout = upstream, state, tools, timeout
        self.spec_tools = set(spec.tools) if spec else set()
        rollout_id = f"mcp-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
        env = {"tools": upstream_schemas(tools, spec)}
        start = Rollout(rollout_id, rollout_id, "observed", env=env)
        self.session = GuardSession(observed_environment(spec), start, budget=budget or MCP_BUDGET)
        self.log = RolloutLog(log, self.session.rollout) if log else None
        self.refused_requests = 0
        self._calls = 0

    def close(self) -> None:
        if self.log is not None:
            attributes = {"guard_refused_requests": str(self.refused_requests)}
            if self.upstream_state.dead:
                attributes["upstream_exit"] = str(self.upstream_state.exit_code)
            self.log.close(attributes)

    async def list_tools(self, ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        if self.upstream_state.dead:  # its tools are no longer offered: the host is told why
            raise MCPError(-32000, self._dead())
        return types.ListToolsResult(tools=self.tools)

    def _dead(self) -> str:
        return f"the upstream MCP server exited (code {self.upstream_state.exit_code}): no tool can run"

    def _schema(self, tool: str) -> Literal["spec", "upstream"] | None:
        if tool in self.spec_tools:
            return "spec"
        return "upstream" if tool in self.session.rollout.env["tools"] else None

    async def call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == REFUSED_TOOL:  # a request the transport could not read (pipeline.apps.guard.upstream)
            arguments = params.arguments or {}
            self.refused_requests += 1
            if self.log is not None:
                self.log.note(refused=arguments.get("tool"), reason=arguments.get("reason"))
            return _tool_error(f"pexec guard refused {arguments.get('tool')}: {arguments.get('reason')}")
        try:
            messages = _messages(params.meta)
        except McpProxyError as exc:
            return _tool_error(str(exc))
        self._calls += 1
        call = Call(params.name, params.arguments or {}, call_id=f"c{self._calls}")
        try:
            for message in messages:
                self.session.message(message["role"], message["content"])
                if self.log is not None:
                    self.log.event(Message(message["role"], message["content"]))
            verdict = self.session.check(call)
        except (InvalidRecord, SessionFull) as exc:  # what `pexec score` would reject: never forwarded, never kept
            self.refused_requests += 1
            if self.log is not None:
                self.log.note(refused=params.name, reason=str(exc))
            return _tool_error(f"pexec guard refused {params.name}: {exc}")
        if not verdict.valid:
            text = refusal(verdict, params.name)
            result, output, error = _tool_error(text), text, True
        else:
            result = await self._forward(params)
            output, error = result_output(result), bool(result.is_error)
        try:
            step = self.session.record(call, output=output, error=error)
        except (InvalidRecord, SessionFull) as exc:  # the upstream's result cannot be kept: the agent is told
            self.refused_requests += 1
            if self.log is not None:
                self.log.note(refused=params.name, reason=f"its result: {exc}")
            return _tool_error(f"pexec guard: the result of {params.name} cannot be logged: {exc}")
        if self.log is not None:
            live: LiveVerdict = {
                "valid": step.valid,
                "check": step.failed_check,
                "cause": step.cause,
                "schema": self._schema(call.tool),
            }
            self.log.event(self.session.rollout.events[-1], live)
        return result

    async def _forward(self, params: types.CallToolRequestParams) -> types.CallToolResult:
        """The upstream's answer, or a tool error that says why there is none (dead, silent, refused)."""
        if self.upstream_state.dead:
            return _tool_error(self._dead())
        try:
            with anyio.fail_after(self.timeout):
                return await self.upstream.call_tool(params.name, params.arguments or {})
        except TimeoutError:
            return _tool_error(
                f"the upstream did not answer {params.name} within {self.timeout:g} s (--upstream-timeout)"
            )
        except MCPError as exc:
            return _tool_error(f"the upstream refused {params.name}: {exc}")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            state = self.upstream_state  # read again: the upstream may have died while the call waited
            return _tool_error(self._dead() if state.dead else f"the upstream went away: {exc!r}")


def _messages(meta: types.RequestParamsMeta | None) -> list[dict[str, str]]:
    raw = dict(meta or {}).get(MESSAGES_META)
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


async def serve_proxy(
    upstream: list[str],
    options: EnvOptions,
    log: str | None,
    env: dict[str, str] | None = None,
    timeout: float = UPSTREAM_TIMEOUT,
    budget: SessionBudget | None = None,
) -> None:
    spec = None
    if options.spec is not None:
        folder = find_spec(options.spec, options.spec_dirs)
        if folder is None:
            raise McpProxyError(f"no spec named {options.spec!r}")
        spec = load_spec(folder)
    transport = UpstreamTransport(upstream, upstream_environment([], []) if env is None else env)
    async with AsyncExitStack() as stack:
        try:  # the handshake and every request read within the timeout
            client = await stack.enter_async_context(Client(transport, read_timeout_seconds=timeout))
            tools = await _list_all(client)
        except (OSError, MCPError, ExceptionGroup, TimeoutError) as exc:  # did not start, or does not speak MCP
            raise McpProxyError(f"upstream MCP server {shlex.join(upstream)!r}: {_reason(exc)}") from exc
        proxy = GuardProxy(client, transport.state, tools, spec, log, timeout, budget)
        stack.callback(proxy.close)
        server: Server[Any] = Server(
            "pexec-guard", version="1", on_list_tools=proxy.list_tools, on_call_tool=proxy.call_tool
        )
        # The SDK only iterates its stdin's lines, which HostRequests gives (it is no whole AsyncFile).
        read, write = await stack.enter_async_context(stdio_server(stdin=HostRequests()))  # type: ignore[arg-type]
        await server.run(read, write, server.create_initialization_options())


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}"


def run_proxy(
    upstream: list[str],
    options: EnvOptions,
    log: str | None,
    env: dict[str, str] | None = None,
    timeout: float = UPSTREAM_TIMEOUT,
    budget: SessionBudget | None = None,
) -> None:
    """Serve on stdin/stdout until the client goes away."""
    if not upstream:
        raise McpProxyError("give the upstream MCP server's command after `--`")
    anyio.run(serve_proxy, upstream, options, log, env, timeout, budget)
