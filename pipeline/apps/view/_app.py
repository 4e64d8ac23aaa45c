"""The viewer's web app (Starlette + Jinja2, autoescaped): cohorts -> the rollouts behind a number -> one
rollout's steps. Every page's state is its URL query, so a link is shareable; nothing is loaded from
outside the package (no CDN)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pipeline.apps.view._queries import PAGE, Filters, RunView
from pipeline.apps.web import ServerLimits, WebGuard, allowed_hosts, listen, require_token, run_server
from pipeline.apps.web.server import DEFAULT_LIMITS
from pipeline.core.errors import ViewError
from pipeline.core.text import public_url
from pipeline.metrics.results import Interval
from pipeline.metrics.settings import VIEW_PORT

_HERE = Path(__file__).parent
_ENV = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=select_autoescape(default=True))


def _href(path: str, pairs: list[tuple[str, str]]) -> str:
    return f"{path}?{urlencode(pairs)}" if pairs else path


def _ci(value: Interval) -> str:
    if value.get("value") is None:
        return "—"
    if value.get("lo") is None:
        return f"{value['value']:.3f}"
    return f"{value['value']:.3f} [{value['lo']:.3f}, {value['hi']:.3f}]"


# A metric whose numerator is a filter links to those rollouts (TER: the executable ones; success: the
# successful ones); the cause counts beside them link to each cause.
DRILL = {"ter": [("fed", "0")], "success": [("success", "true")]}

_ENV.globals |= {"href": _href, "ci": _ci, "drill": DRILL}


def create_app(view: RunView) -> Starlette:
    def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        shown = {"run": public_url(view.run.url), "completeness": view.run.completeness()}
        html = _ENV.get_template(name).render(**shown, coverage_note=view.coverage_note, **context)
        return HTMLResponse(html, status_code=status)

    def cohorts(request: Request) -> Response:
        data = view.cohorts()
        rows = []
        for c in data.cohorts:
            base = Filters(labels=tuple((k, c.key[k]) for k in data.keys))
            rows.append({"cohort": c, "base": base})
        return render("cohorts.html", data=data, rows=rows, page_title="Cohorts")

    def rollouts(request: Request) -> Response:
        params = list(request.query_params.multi_items())
        filters = Filters.parse(params, ["benchmark", *view.labels])
        after = _after(request)
        page = view.rollouts(filters, after)
        return render(
            "rollouts.html",
            filters=filters,
            page=page,
            page_size=PAGE,
            text_columns={"task_id", "benchmark", "first_cause", "status", *view.labels},
            first=after is None,
            page_title="Rollouts",
        )

    def rollout(request: Request) -> Response:
        q = request.query_params
        missing = [k for k in ("run", "shard", "id") if k not in q]
        if missing:
            raise ViewError(f"missing {', '.join(missing)} in the link")
        back = [(k, v) for k, v in q.multi_items() if k not in ("run", "shard", "id")]
        data = view.rollout(q["run"], q["shard"], q["id"])
        return render("rollout.html", r=data, back=back, labels=view.labels, page_title=f"Rollout {q['id']}")

    async def refused(request: Request, exc: Exception) -> Response:
        return render("error.html", status=400, message=str(exc), page_title="Not found")

    return Starlette(
        routes=[
            Route("/", cohorts),
            Route("/rollouts", rollouts),
            Route("/rollout", rollout),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        exception_handlers={ViewError: refused},
    )


def _after(request: Request) -> tuple[str, str, str] | None:
    q = request.query_params
    run, rollout_id, shard = q.get("after_run"), q.get("after_id"), q.get("after_shard")
    if run is None and rollout_id is None and shard is None:
        return None
    if run is None or rollout_id is None or shard is None:
        raise ViewError("a page link needs after_run, after_id and after_shard")
    return run, rollout_id, shard


def check_token(host: str, token: str | None) -> None:
    """Refuse an address beyond loopback without a token: every trajectory and user message would be public."""
    require_token(host, token, "the viewer")


def serve(
    view: RunView,
    host: str = "127.0.0.1",
    port: int = VIEW_PORT,
    token: str | None = None,
    limits: ServerLimits = DEFAULT_LIMITS,
    extra_hosts: tuple[str, ...] = (),
    sock: socket.socket | None = None,
) -> None:
    """Serve until interrupted (Ctrl-C), behind the hardened server layer: Host and Origin checked, the token
    (a bearer header, or the cookie a `?token=` link sets) when one is given. `sock`: the socket already
    listening on host:port (pipeline.apps.web.listen), else it is bound here."""
    check_token(host, token)
    sock = sock if sock is not None else listen(host, port)
    port = sock.getsockname()[1]
    app = WebGuard(create_app(view), limits, allowed_hosts(host, port, extra_hosts), token, browser=True)
    run_server(app, host, port, limits, sock)
