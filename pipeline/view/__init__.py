"""`pexec view`: a local web viewer over a run (docs/explanation/architecture.md, "The viewer").

_queries.py  what the pages show, read from the run with DuckDB in place
_app.py      the Starlette app, its Jinja2 templates (templates/) and stylesheet (static/)
sql/        the pages' queries

Imports: core, storage, metrics, web.
"""

from pipeline.view._app import check_address, check_token, create_app, serve
from pipeline.view._queries import Filters, RunView, ViewError

__all__ = ["Filters", "RunView", "ViewError", "check_address", "check_token", "create_app", "serve"]
