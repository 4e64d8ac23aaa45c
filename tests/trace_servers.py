"""Real trace stores on loopback for the MLflow and Phoenix round trips (tests/test_traces_*.py): each server runs
from a virtual environment of its own, `.venv/servers/<name>`, which `make servers` (and `make test`) builds from
`tests/servers/<name>.txt`. MLflow's server cannot share the project's environment: it caps pyarrow below the
26 the core pins. Phoenix's could (it resolves to the project's versions of every package both need), but it
brings 43 packages more (pydantic-ai, anthropic, fastmcp…) that only its server process uses; one way for both.
The product's side, the clients of the extras `pexec[mlflow]` and `pexec[phoenix]`, is installed in the project's
environment as usual.

A server gets a free port on 127.0.0.1 and a SQLite database under the test's folder; it is stopped (its process
group) when the module's tests are done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import free_port, wait_for

# A server's start creates its database (migrations) and imports a lot: 10-20 s on an idle machine; under the
# shared machine's worst load MLflow's took 108 s.
START_TIMEOUT_S = 300


def server_python_path(name: str) -> Path:
    """Where the interpreter of the server's own environment is, once `make servers` has built it."""
    return Path(sys.prefix) / "servers" / name / "bin" / "python"


def server_python(name: str) -> Path:
    """The interpreter of the server's own environment; a clear failure (not a skip: the test is required)."""
    python = server_python_path(name)
    if not python.exists():
        raise AssertionError(f"{python} is missing: `make servers` builds it from tests/servers/{name}.txt")
    return python


@contextmanager
def _serving(args: list[str], health: str, log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)  # fmt: skip

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, START_TIMEOUT_S, f"{health} (log: {log})")
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """An MLflow tracking server (SQLite backend, artifacts under `folder`); yields its URL."""
    port = free_port()
    args = [str(server_python("mlflow")), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
            "--default-artifact-root", str(folder / "artifacts"), "--workers", "1"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # No job runner: it starts some eight worker processes for server-side jobs (scorers, optimisers) these
    # tests never run.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with _serving(args, f"{url}/health", folder / "mlflow.log", env):
        yield url


@contextmanager
def phoenix_server(folder: Path) -> Iterator[str]:
    """A Phoenix server (SQLite under `folder`, OTLP over HTTP on the same port, gRPC on another); yields its URL."""
    port = free_port()
    env = {"PHOENIX_WORKING_DIR": str(folder), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_TELEMETRY_ENABLED": "false"}  # fmt: skip
    args = [str(server_python("phoenix")), "-m", "phoenix.server.main", "serve"]
    url = f"http://127.0.0.1:{port}"
    with _serving(args, f"{url}/healthz", folder / "phoenix.log", env):
        yield url


def score_support(store: Path, run: Path) -> None:
    """`pexec score STORE --out RUN --env observed --spec support --inline`, in this process."""
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings

    run_scoring(str(store), str(run), ScoreSettings(env="observed", spec="support", inline=True))
