"""The pre-execution guard: the batch checker's S/D/P checks on a live agent's next call, before it runs
(docs/explanation/architecture.md, "The guard").

session.py    the library API: a live session's state kept incrementally
service.py    sessions with a time-to-live and a bound, independent of any web framework
http.py       the HTTP service (`pexec guard serve`)
mcp.py        the MCP proxy (`pexec guard mcp`)
upstream.py   the MCP proxy's two stdio pipes, bounded (the upstream's process, the host's requests)
_journal.py    the MCP proxy's append-only log and the canonical rollout written from it
ray_serve.py  the HTTP service as a Ray Serve application
replay.py     `pexec guard replay`: what the guard under a new spec would have refused on recorded traffic

Imports: core, envs, replay, web.
"""

from pipeline.apps.guard.session import (
    EnvironmentPool,
    GuardSession,
    GuardVerdict,
    MemoryBudget,
    SessionBudget,
    open_session,
)
from pipeline.core.errors import GuardFull, SessionFull

__all__ = [
    "EnvironmentPool",
    "GuardFull",
    "GuardSession",
    "GuardVerdict",
    "MemoryBudget",
    "SessionBudget",
    "SessionFull",
    "open_session",
]
