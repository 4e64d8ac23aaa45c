"""The pre-execution guard (docs/design.md §5.7): the batch checker's S/D/P checks on a live agent's next call,
before it runs. session.py is the library API; http.py the HTTP service; mcp.py the MCP proxy."""

from pipeline.guard.session import EnvironmentPool, GuardSession, GuardVerdict, open_session

__all__ = ["EnvironmentPool", "GuardSession", "GuardVerdict", "open_session"]
