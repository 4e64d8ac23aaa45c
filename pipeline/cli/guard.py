"""`pexec guard serve|mcp`: the pre-execution guard as an HTTP service or as an MCP proxy in front of an
upstream server."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.cli.options import Policy, SpecDir, check_policy
from pipeline.cli.render import console
from pipeline.envs import EnvOptions

guard_app = typer.Typer(no_args_is_help=True, help="Pre-execution guard: check an agent's next call before it runs.")
GuardSpec = Annotated[str | None, typer.Option("--spec", help="Spec giving `observed` its schemas and rules.")]


@guard_app.command("serve")
def serve(
    env: Annotated[str, typer.Option("--env", help="Environment of every session (as `score --env`).")],
    spec: GuardSpec = None,
    spec_dir: SpecDir = None,
    policy: Policy = "code",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8765,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="PEXEC_GUARD_TOKEN", help="Bearer token; required beyond loopback."),
    ] = None,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, help="Live sessions kept at most.")] = 1000,
    ttl: Annotated[float, typer.Option("--ttl", min=1, help="Seconds an idle session is kept.")] = 600.0,
) -> None:
    """Serve the guard over HTTP: sessions (create, check, record, message, close) and stateless checks."""
    from pipeline.guard.http import require_token
    from pipeline.guard.http import serve as serve_http
    from pipeline.guard.service import Guard, Limits

    check_policy(policy)
    require_token(host, token)  # before an environment is built
    guard = Guard(env, EnvOptions(tuple(spec_dir or ()), spec, policy), Limits(max_sessions, ttl))
    console.print(f"guard: {env} ({guard.version}) on http://{host}:{port}")
    serve_http(guard, host, port, token)


@guard_app.command("mcp")
def mcp(
    upstream: Annotated[list[str], typer.Argument(help="The upstream MCP server's command, after `--`.")],
    spec: GuardSpec = None,
    spec_dir: SpecDir = None,
    log: Annotated[
        str | None, typer.Option("--log", help="Canonical rollout log to append (JSONL; default: none).")
    ] = None,
) -> None:
    """Run as a stdio MCP server in front of an upstream one, refusing calls that fail S, D or P."""
    from pipeline.guard.mcp import run_proxy

    run_proxy(upstream, EnvOptions(tuple(spec_dir or ()), spec), log)
