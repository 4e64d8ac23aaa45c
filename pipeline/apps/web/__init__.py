"""The HTTP server the guard and the viewer run on, hardened the same way for both (docs/reference/limits.md,
"Hardening"): request bodies counted while they stream, header, idle and body timeouts, a concurrency limit,
`Host` and `Origin` checked against the address served, and bearer tokens compared in constant time.

server.py  the uvicorn settings, its connection protocol with a header timeout, and the ASGI guard layer

Imports: core.
"""

from pipeline.apps.web.server import (
    ServerLimits,
    WebGuard,
    allowed_hosts,
    is_loopback,
    listen,
    read_token,
    require_token,
    run_server,
)

__all__ = [
    "ServerLimits",
    "WebGuard",
    "allowed_hosts",
    "is_loopback",
    "listen",
    "read_token",
    "require_token",
    "run_server",
]
