"""The command line, `pexec`: a thin layer over the Python API that parses options, calls one stage's functions
and renders what they return. User-facing errors end in one place: `error: <message>` on one line, exit 2.

app.py holds the app, its error boundary and the list of commands; _options.py every option more than one
command takes; _render.py what they print; one module per group of commands (stores, scoring, jobs, analysis,
envs, guard, bench).

Imports: every stage.
"""

from pipeline.core.arrow import answer_pandas_probe

answer_pandas_probe()  # before any command converts a value (see pipeline.core.arrow)

from pipeline.apps.cli.app import app  # noqa: E402

__all__ = ["app"]
