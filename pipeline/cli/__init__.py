"""The command line, `pexec`: a thin layer over the Python API that parses options, calls one stage's functions
and renders what they return. User-facing errors end in one place: `error: <message>` on one line, exit 2.

Imports: every stage.
"""

from pipeline.cli.main import app

__all__ = ["app"]
