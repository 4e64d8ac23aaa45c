"""The suite's markers of what a test starts (tests/conftest.py, tests/launches.py): a test takes the markers of
the fixtures it uses, `-m` selects by them, and a test that starts a server process without its marker fails
saying which marker to add. Ray's and a browser's processes are told apart from a server by what they run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launches import Process

ROOT = Path(__file__).resolve().parents[1]

# An inner suite under this repository's conftest and pytest settings: a server process started by an unmarked
# test, by a marked one, by a fixture declared with `starts`, and a short command that listens on nothing. Each
# server lives until the test's teardown, so it is running when the test's outcome is decided.
INNER = """
import subprocess, sys
import pytest
from conftest import starts

def serve(request):
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    request.addfinalizer(proc.kill)
    assert proc.stdout.readline().startswith("Serving HTTP")  # it listens

@pytest.fixture
@starts("server")
def served(request):
    serve(request)

def test_unmarked(request):
    serve(request)

@pytest.mark.server
def test_marked(request):
    serve(request)

def test_through_a_declared_fixture(served):
    pass

def test_a_short_command():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def inner_suite(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for helper in ("conftest.py", "launches.py"):
        shutil.copy(ROOT / "tests" / helper, tmp_path / "tests")
    (tmp_path / "tests" / "test_inner.py").write_text(INNER)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.server  # the inner suite's tests start servers
def test_a_server_started_without_its_marker_fails_the_test_naming_the_marker(tmp_path: Path) -> None:
    done = inner_suite(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    outcomes = {line.split(" ")[1]: line.split(" ")[0] for line in done.stdout.splitlines()
                if line.startswith(("PASSED ", "FAILED ", "ERROR "))}  # fmt: skip
    assert outcomes == {
        "tests/test_inner.py::test_unmarked": "FAILED",
        "tests/test_inner.py::test_marked": "PASSED",
        "tests/test_inner.py::test_through_a_declared_fixture": "PASSED",
        "tests/test_inner.py::test_a_short_command": "PASSED",
    }
    said = "tests/test_inner.py::test_unmarked starts a server process (`python -u -m http.server …`"
    assert said in done.stdout and "but is not marked `server`: add @pytest.mark.server" in done.stdout


@pytest.mark.server
def test_a_fixtures_declaration_marks_the_tests_using_it_and_m_selects_by_it(tmp_path: Path) -> None:
    done = inner_suite(tmp_path, "-m", "server")
    assert done.returncode == 0, done.stdout + done.stderr
    passed = sorted(line.split(" ")[1] for line in done.stdout.splitlines() if line.startswith("PASSED "))
    assert passed == ["tests/test_inner.py::test_marked", "tests/test_inner.py::test_through_a_declared_fixture"]
    assert "-m 'server' selected 2 tests and left 2 to `make test` (" in done.stdout


@pytest.mark.parametrize(
    ("program", "command", "kind"),
    [
        ("gcs_server", ("/venv/lib/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray/s/logs"), "ray"),
        ("raylet", ("/venv/lib/ray/core/src/ray/raylet/raylet",), "ray"),
        ("ray", ("/venv/bin/python", "/venv/bin/ray", "start", "--head"), "ray"),
        ("ray::IDLE", ("ray::IDLE",), "ray-process"),
        ("python", ("/venv/bin/python", "-u", "/venv/site-packages/ray/_private/log_monitor.py"), "ray-process"),
        ("chromium", ("/usr/lib/chromium/chromium", "--headless"), "browser"),
        ("python", ("/venv/bin/python", "/venv/bin/pexec", "view", "run", "--port", "8000"), None),
        ("python", ("/venv/bin/python", "-m", "moto.server", "-p", "5555"), None),
    ],
)
def test_what_a_process_is_comes_from_what_it_runs(program: str, command: tuple[str, ...], kind: str | None) -> None:
    assert Process(1, program, command).kind() == kind
