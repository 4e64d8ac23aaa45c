"""The pre-execution guard: the batch checker's S/D/P checks on a live agent's next call, before it runs
(docs/explanation/architecture.md, "The guard").

session.py    the library API: a live session's state kept incrementally
service.py    sessions with a time-to-live and a bound, independent of any web framework
http.py       the HTTP service (`pexec guard serve`)
mcp.py        the MCP proxy (`pexec guard mcp`)
ray_serve.py  the HTTP service as a Ray Serve application
replay.py     `pexec guard replay`: what the guard under a new spec would have refused on recorded traffic

Imports: core, envs, replay.
"""

from pipeline.guard.session import EnvironmentPool, GuardSession, GuardVerdict, open_session

__all__ = ["EnvironmentPool", "GuardSession", "GuardVerdict", "open_session"]
