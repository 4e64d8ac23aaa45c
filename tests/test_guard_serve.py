"""The guard on Ray Serve (pipeline.apps.guard.ray_serve): the application builder, and a real local Serve
deployment answering stateless checks over HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request

import orjson
import pytest
from conftest import free_port

from pipeline.apps.guard.http import GuardServerError

# Ray Serve (and pipeline.apps.guard.ray_serve, which imports it) is imported in the tests, not when the suite is
# collected: over half a second in each worker, for two tests.

AVA = "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701)."
SIGN_IN = {"tool": "authenticate", "arguments": {"email": "ava.lopez@example.com", "zip": "78701"}}


def test_the_builder_makes_the_deployment_and_refuses_bad_arguments():
    from ray import serve

    from pipeline.apps.guard.ray_serve import guard_application

    app = guard_application({"env": "shop", "token": "t", "num_replicas": 3, "ttl_s": 30})
    assert isinstance(app, serve.Application)
    assert (app._bound_deployment.name, app._bound_deployment.num_replicas) == ("pexec-guard", 3)
    with pytest.raises(GuardServerError, match="unknown guard argument"):
        guard_application({"env": "shop", "replicas": 2})
    with pytest.raises(GuardServerError, match=r"needs args\.env"):
        guard_application({})


def post(port: int, path: str, body: dict, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", orjson.dumps(body), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_a_serve_deployment_answers_stateless_checks(shared_ray):
    # On the suite's shared Ray: Serve's controller and proxy are actors of their own, all gone at shutdown.
    from ray import serve

    from pipeline.apps.guard.ray_serve import guard_application

    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(guard_application({"env": "shop", "token": "t", "num_replicas": 1}), name="guard", route_prefix="/")
        events = [{"type": "message", "role": "user", "content": AVA}]
        status, verdict = post(port, "/check", {"events": events, "call": SIGN_IN}, "t")
        assert status == 200 and verdict["valid"] and verdict["output"] == {"user_id": "U1001"}
        assert post(port, "/check", {"events": [], "call": SIGN_IN}, None) == (
            401,
            {"error": "missing or wrong bearer token"},
        )
        status, verdict = post(port, "/check", {"events": [], "call": SIGN_IN}, "t")
        assert (verdict["valid"], verdict["failed_check"], verdict["cause"]) == (False, "D", "information")
    finally:
        serve.shutdown()
