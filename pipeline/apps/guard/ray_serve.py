"""The guard's HTTP service as a Ray Serve application (infra/k8s/rayservice-guard.yaml), for many replicas
behind Serve's proxy (docs/explanation/architecture.md, "The guard").

Serve routes a request to any replica, so a multi-replica deployment answers the stateless `POST /check`
(each replica keeps its own prefix cache; a miss replays the prefix) and keeps the session endpoints for
one replica. Serve listens beyond loopback: a bearer token is required, from the application's `token`
argument or the replicas' PEXEC_GUARD_TOKEN.
"""

from __future__ import annotations

import os
from typing import Any

from ray import serve

from pipeline.apps.guard.http import GuardServerError, create_app
from pipeline.apps.guard.service import Guard, Limits
from pipeline.apps.web import WebGuard
from pipeline.envs import EnvOptions

# The builder's arguments (Serve config `args`) and their defaults.
ARGUMENTS: dict[str, Any] = {
    "env": None,
    "spec": None,
    "spec_dirs": [],
    "policy": "code",
    "max_sessions": 1000,
    "ttl_s": 600.0,
    "token": None,
    "num_replicas": 2,
}


@serve.ingress()
class GuardReplica:
    """One replica: a Guard of its own and the Starlette app over it."""

    def __init__(self, settings: dict[str, Any]) -> None:
        token = settings["token"] or os.environ.get("PEXEC_GUARD_TOKEN")
        if not token:
            raise GuardServerError("the guard on Ray Serve needs a bearer token: args.token or PEXEC_GUARD_TOKEN")
        options = EnvOptions(tuple(settings["spec_dirs"]), settings["spec"], settings["policy"])
        self._guard = Guard(settings["env"], options, Limits(settings["max_sessions"], settings["ttl_s"]))
        self._token = token

    def __serve_build_asgi_app__(self) -> WebGuard:
        return create_app(self._guard, self._token)


def guard_application(args: dict[str, Any]) -> serve.Application:
    """Serve's application builder: `import_path: pipeline.apps.guard.ray_serve:guard_application`, with `args`
    from ARGUMENTS (`env` required)."""
    unknown = sorted(set(args) - set(ARGUMENTS))
    if unknown:
        raise GuardServerError(f"unknown guard argument(s) {', '.join(unknown)} (known: {', '.join(ARGUMENTS)})")
    settings = {**ARGUMENTS, **args}
    if not isinstance(settings["env"], str) or not settings["env"]:
        raise GuardServerError("the guard needs args.env: the environment of every session")
    replicas = settings.pop("num_replicas")
    deployment = serve.deployment(name="pexec-guard", num_replicas=replicas)(GuardReplica)
    application: serve.Application = deployment.bind(settings)  # `bind` has unannotated parameters: Any to mypy
    return application
