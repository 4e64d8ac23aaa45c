"""`pexec guard serve|mcp`: the pre-execution guard as an HTTP service or as an MCP proxy in front of an
upstream server."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.apps.cli._options import (
    GUARD_PORT,
    AllowHost,
    HeaderTimeout,
    MaxConcurrency,
    Policy,
    ShutdownTimeout,
    SpecDir,
    TokenFile,
    server_limits,
)
from pipeline.apps.cli._render import console
from pipeline.envs import EnvOptions
from pipeline.scoring.settings import environment_options

guard_app = typer.Typer(no_args_is_help=True, help="Pre-execution guard: check an agent's next call before it runs.")
GuardSpec = Annotated[str | None, typer.Option("--spec", help="Spec giving `observed` its schemas and rules.")]


@guard_app.command("serve")
def serve(
    env: Annotated[str, typer.Option("--env", help="Environment of every session (as `score --env`).")],
    spec: GuardSpec = None,
    spec_dir: SpecDir = None,
    policy: Policy = "code",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: one the system picks).")
    ] = GUARD_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="PEXEC_GUARD_TOKEN",
            help="Bearer token; required beyond loopback (prefer --token-file or the variable: "
            "an option shows in the process list).",
        ),
    ] = None,
    token_file: TokenFile = None,
    allow_host: AllowHost = None,
    max_sessions: Annotated[
        int, typer.Option("--max-sessions", min=1, max=100_000, help="Live sessions kept at most.")
    ] = 1000,
    ttl: Annotated[float, typer.Option("--ttl", min=1, max=86_400, help="Seconds an idle session is kept.")] = 600.0,
    session_mb: Annotated[
        int, typer.Option("--session-mb", min=1, max=1024, help="MiB of events one session holds at most.")
    ] = 16,
    cache_mb: Annotated[
        int, typer.Option("--cache-mb", min=0, max=65_536, help="MiB of events the stateless cache holds at most.")
    ] = 128,
    memory_mb: Annotated[
        int,
        typer.Option(
            "--memory-mb",
            min=1,
            max=1_048_576,
            help="MiB all sessions take together, live and cached, empty sessions' cost included; past it 429.",
        ),
    ] = 16_384,
    header_timeout: HeaderTimeout = 5.0,
    max_concurrency: MaxConcurrency = 64,
    shutdown_timeout: ShutdownTimeout = 10.0,
) -> None:
    """Serve the guard over HTTP: sessions (create, check, record, message, close) and stateless checks."""
    from pipeline.apps.guard.http import require_token
    from pipeline.apps.guard.http import serve as serve_http
    from pipeline.apps.guard.service import Guard, Limits
    from pipeline.apps.web import listen, read_token

    options = environment_options(spec, spec_dir or (), policy)
    token = read_token(token, token_file)
    require_token(host, token)  # before an environment is built
    mib = 1024 * 1024
    limits = Limits(
        max_sessions,
        ttl,
        max_session_bytes=session_mb * mib,
        max_cache_bytes=cache_mb * mib,
        max_memory_bytes=memory_mb * mib,
    )
    guard = Guard(env, options, limits)
    with listen(host, port) as sock:  # bound before the banner says so
        port = sock.getsockname()[1]
        console.print(f"guard: {env} ({guard.version}) on http://{host}:{port}")
        limited = server_limits(header_timeout, max_concurrency, shutdown_timeout)
        serve_http(guard, host, port, token, limited, tuple(allow_host or ()), sock)


@guard_app.command("mcp")
def mcp(
    upstream: Annotated[list[str], typer.Argument(help="The upstream MCP server's command, after `--`.")],
    spec: GuardSpec = None,
    spec_dir: SpecDir = None,
    log: Annotated[
        str | None,
        typer.Option("--log", help="Folder of canonical rollout logs, one per session (appended; default: none)."),
    ] = None,
    env_allow: Annotated[
        list[str] | None,
        typer.Option(
            "--env-allow",
            help="Pass the upstream the environment variables matching this pattern too, e.g. 'GITHUB_*' "
            "(repeatable; default: only PATH, HOME and the locale, LANG, LANGUAGE and LC_*; '*' passes all).",
        ),
    ] = None,
    env_deny: Annotated[
        list[str] | None,
        typer.Option(
            "--env-deny",
            help="Keep the variables matching this pattern, in any case, from the upstream (repeatable).",
        ),
    ] = None,
    upstream_timeout: Annotated[
        float,
        typer.Option(
            "--upstream-timeout", min=0.1, max=3600, help="Seconds a forwarded call waits for the upstream's answer."
        ),
    ] = 60.0,
    session_mb: Annotated[
        int,
        typer.Option(
            "--session-mb", min=1, max=65_536, help="MiB of events the session holds; past it calls are refused."
        ),
    ] = 256,
) -> None:
    """Run as a stdio MCP server in front of an upstream one, refusing calls that fail S, D or P."""
    from pipeline.apps.guard.mcp import MCP_BUDGET, run_proxy
    from pipeline.apps.guard.session import SessionBudget
    from pipeline.apps.guard.upstream import upstream_environment

    env = upstream_environment(env_allow or [], env_deny or [])
    budget = SessionBudget(MCP_BUDGET.max_events, session_mb * 1024 * 1024)
    run_proxy(upstream, EnvOptions(tuple(spec_dir or ()), spec), log, env, upstream_timeout, budget)
