"""`pexec view`: a local web viewer over a run (docs/explanation/architecture.md, "The viewer").

_queries.py  what the pages show, read from the run with DuckDB in place
_app.py      the Starlette app, its Jinja2 templates (templates/) and stylesheet (static/)
sql/        the pages' queries

Imports: core, storage, metrics, web.
"""

from pipeline.apps.view._app import check_token, create_app, serve
from pipeline.apps.view._queries import Filters, RunView
from pipeline.core.errors import ViewError

__all__ = ["Filters", "RunView", "ViewError", "check_token", "create_app", "serve"]
