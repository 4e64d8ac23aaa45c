"""Fixtures shared by test modules: a real S3-compatible server (moto, server mode) on loopback, started by
the script developers use (infra/local/s3-server.sh)."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import fsspec
import pytest
from launches import WATCHED, Launches

ROOT = Path(__file__).resolve().parents[1]

# A suite started in the background by a non-interactive shell (`make test &`) inherits Ctrl-C ignored, and so
# would every `pexec` it starts: the tests of what Ctrl-C does need it delivered. A handled signal is back to
# its default in a child at exec, so this reaches them too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# pytest-xdist's workers run with COLUMNS=80 and LINES=24 in their environment; without xdist there are none. Human
# output fits COLUMNS, so the suite drops both: a test sees the same width (a pipe's) however it is run, and a test
# about widths sets COLUMNS itself.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


# --- What a test starts --------------------------------------------------------------------------------------
# Each marker below (pyproject.toml says what each means) names something a test starts that costs seconds or
# needs more than the venv: `make check` runs the tests that carry none of them, `make test` runs every test.
# A test gets a marker from a decorator or its module's `pytestmark`, or from a fixture it uses, directly or
# through other fixtures, whose function is declared with `starts`. Whatever is selected, a test that starts Ray,
# a server process or a browser without the marker for it fails (`_Launches`), so the split cannot drift.
STARTS_MARKERS = ("ray", "server", "browser", "docs", "cluster", "other_python")
# A finer marker carries the broader one: `-m "not ray"` leaves out the cluster tests too.
IMPLIED = {"cluster": "ray", "trace_server": "server"}

_Fixture = TypeVar("_Fixture", bound=Callable[..., object])


def starts(*markers: str) -> Callable[[_Fixture], _Fixture]:
    """Declares what a fixture starts: every test that uses it gets these markers. Goes under @pytest.fixture."""
    unknown = set(markers) - set(STARTS_MARKERS) - set(IMPLIED)
    if unknown:
        raise ValueError(f"not a marker of what a test starts: {sorted(unknown)}")

    def declare(fixture: _Fixture) -> _Fixture:
        fixture.pexec_starts = markers  # type: ignore[attr-defined]
        return fixture

    return declare


def _declared_markers(item: pytest.Item) -> set[str]:
    """The item's markers of what it starts, with those of its fixtures' declarations and the implied ones."""
    names = {mark.name for mark in item.iter_markers()}
    fixture_info = getattr(item, "_fixtureinfo", None)  # collected functions have it; other items start nothing
    if fixture_info is not None:
        for definitions in fixture_info.name2fixturedefs.values():
            for definition in definitions:
                names.update(getattr(definition.func, "pexec_starts", ()))
    names.update(IMPLIED[name] for name in list(names) if name in IMPLIED)
    return names


# The modules that take longest on the 2-core machine, longest first. On pytest-xdist's workers (a module at a time,
# in this order) they are collected first, so that no worker is left with one of them while the other has finished
# everything else. Left out of date, it only costs time. `make test` (about 20 s to 75 s each); its order also sets
# which modules run beside each other, and the suite is known to pass with it:
LONGEST_MODULES = (
    "test_cluster.py",
    "test_lease.py",
    "test_bench.py",
    "test_scale.py",
    "test_storage_errors.py",
    "test_cli.py",
    "test_guard_mcp_bounds.py",
    "test_report.py",
    "test_metric_properties.py",
    "test_coverage.py",
    "test_pipeline.py",
    "test_traces_mlflow.py",
    "test_traces_phoenix.py",
)
# A run narrowed by `-m` (`make check`, about 7 s to 20 s each):
LONGEST_CHECKED = (
    "test_lease.py",
    "test_tau_banking.py",
    "test_figures.py",
    "test_score_raw.py",
    "test_read_bounds.py",
    "test_cli.py",
    "test_report.py",
    "test_plugins.py",
    "test_producers_otel.py",
    "test_coverage.py",
    "test_otlp_files.py",
    "test_aggregate.py",
    "test_smoke.py",
    "test_pipeline.py",
    "test_producers_agents.py",
    "test_record_budget.py",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        present = {mark.name for mark in item.iter_markers()}
        for name in sorted(_declared_markers(item) - present):
            item.add_marker(name)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # a run in one process keeps the order of the files
    rank = {name: i for i, name in enumerate(LONGEST_CHECKED if config.option.markexpr else LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


_launches = Launches()
_REPORTED = pytest.StashKey[bool]()
WHAT = {"ray": "Ray", "server": "a server process", "browser": "a browser"}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Watches what the test starts, from its fixtures' set-up to their teardown, for what it is not marked."""
    _launches.begin(set(WATCHED) - {mark.name for mark in item.iter_markers()})
    try:
        return (yield)
    finally:
        _launches.end()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Fails a test (once: at the first phase that shows it) that started what it is not marked for."""
    report: pytest.TestReport = yield
    started = _launches.found()
    if started and not report.skipped and not item.stash.get(_REPORTED, False):
        item.stash[_REPORTED] = True
        said = "; ".join(
            f"starts {WHAT[kind]} ({process}) but is not marked `{kind}`: add @pytest.mark.{kind}, or declare the"
            f" fixture that starts it with @starts({kind!r}) (tests/conftest.py)"
            for kind, process in sorted(started.items())
        )
        earlier = f"\n{report.longreprtext}" if report.failed else ""
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} {said}{earlier}"
    return report


# How many tests the run selected, and how many `-m` left out, by marker. Counted where the suite is collected:
# under pytest-xdist each worker collects it all (alike) and hands the counts to the controller, which does not.
TIER_MARKERS = (*STARTS_MARKERS, "fuzz", "corpus", "memory")
_selection: Counter[str] = Counter()


def pytest_deselected(items: list[pytest.Item]) -> None:
    _selection["left out"] += len(items)
    _selection.update(name for item in items for name in TIER_MARKERS if item.get_closest_marker(name))


def pytest_collection_finish(session: pytest.Session) -> None:
    _selection["selected"] = len(session.items)
    # Collecting imports every test module and what they import (inspect_ai, pydantic, matplotlib, ...): hundreds of
    # thousands of long-lived objects that each of Python's full garbage collections would walk again, hundreds of
    # times over a run. Frozen, they are left out of every collection (about 5% of a worker's CPU time).
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.unfreeze()  # collectable again at exit: a frozen object is never freed, and nanobind reports it as a leak


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if worker_output is not None:
        worker_output["pexec_selection"] = dict(_selection)


@pytest.hookimpl(optionalhook=True)  # an xdist hook, on the controller
def pytest_testnodedown(node: Any, error: object) -> None:
    counts = getattr(node, "workeroutput", {}).get("pexec_selection")
    if counts and not _selection:
        _selection.update(counts)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """After a run that `-m` narrowed (`make check`): how many tests it selected and how many it left out."""
    if not config.option.markexpr or not _selection["left out"]:
        return
    selected, left_out = _selection["selected"], _selection["left out"]
    counts = ", ".join(f"{name} {_selection[name]}" for name in TIER_MARKERS if _selection[name])
    terminalreporter.write_line(
        f"-m {config.option.markexpr!r} selected {selected} tests and left {left_out} to `make test` ({counts}; a"
        f" test may carry several of these markers), which runs all {selected + left_out}"
    )


def s3_filesystem(options: dict) -> Any:
    """s3fs's filesystem over the test S3 server. s3fs is imported here, not at the top of the test modules: every
    worker of `make check` collects them all and starts no S3 server."""
    import s3fs

    return s3fs.S3FileSystem(**options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the process group of `proc` (started with start_new_session), then its end awaited; one that
    has not ended in `timeout` seconds is killed before the error is raised, so it does not go on taking the
    machine from the tests after it, in a session of its own."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# How many inputs a property test generates: its own size in `make test`, at least PEXEC_FUZZ_EXAMPLES in
# `make fuzz`, which runs the tests marked `fuzz`; a property whose CI size is a sample of a larger space
# carries that marker, so the large size runs there.
FUZZ_EXAMPLES = int(os.environ.get("PEXEC_FUZZ_EXAMPLES", "0"))


def examples(ci: int) -> int:
    return max(ci, FUZZ_EXAMPLES)


# The one set of options for a local Ray in tests: 2 CPUs, as on this project's machines.
RAY_OPTIONS = {"num_cpus": 2, "include_dashboard": False, "logging_level": "WARNING"}
# Serve's controller gives a starting proxy 5 s to answer its readiness check, three times, then kills it, and
# `serve.start` fails with ActorDiedError: on the 2-core machine under the whole suite a proxy once took 15 s.
SERVE_UNDER_LOAD = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"}
# The node id of the Ray that `shared_ray` started, while it runs: tells it apart from a Ray started by a test
# itself (run_scoring with options of its own, a bench), which is never reused.
_shared_node: list[str] = []


def _running_node() -> str | None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _stop_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    _shared_node.clear()


def _start_ray(worker_env: dict[str, str]) -> str:
    """Starts a local Ray (RAY_OPTIONS); its workers see this process's environment plus `worker_env` (this
    process's own is left as it was)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    before = {name: os.environ.get(name) for name in worker_env}
    os.environ.update(worker_env)  # Ray's processes, and the workers they start, copy it at ray.init
    try:
        ray.init(**RAY_OPTIONS)
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return ray.get_runtime_context().get_node_id()


@pytest.fixture
@starts("ray")
def shared_ray() -> None:
    """The local Ray (RAY_OPTIONS) that every test asking for it shares, started at the first such test and kept
    until the session ends, or until a test stops it (a bench, a test that scores with options of its own): then
    the next one starts it again. Each start costs seconds of the suite, and `run_scoring` reuses a running Ray.
    Its workers outlive the test: a task worker a test kills is replaced, and Serve's actors end at its
    shutdown."""
    shared_ray_address()


def shared_ray_address() -> str:
    """The shared Ray (see `shared_ray`), started if it is not running; its address, for a `pexec` process the
    test starts to join (RAY_ADDRESS) instead of starting a Ray of its own."""
    import ray

    node = _running_node()
    if node is None or node not in _shared_node:
        _stop_ray()  # a Ray of another test's options: never reused
        # A module's `s3` fixture may come after the shared Ray started: its workers have the credentials already.
        _shared_node.append(_start_ray(worker_env=CREDENTIALS | SERVE_UNDER_LOAD))
    return ray.get_runtime_context().gcs_address


@pytest.fixture(autouse=True, scope="module")
def _no_ray_across_modules() -> Iterator[None]:
    """No module inherits a Ray from another, except the shared one (its options are fixed): the order of test
    modules then changes nothing."""
    yield
    if _running_node() not in _shared_node:
        _stop_ray()


@pytest.fixture(autouse=True, scope="session")
def _ray_stopped_at_the_end() -> Iterator[None]:
    yield
    _stop_ray()


@pytest.fixture(scope="module")
@starts("server")
def s3() -> Iterator[dict]:
    """A moto S3 server on a free loopback port with the bucket `pexec-test`; yields storage options for pexec."""
    os.environ.update(CREDENTIALS)  # Ray workers started later inherit them
    port = free_port()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "infra/local/s3-server.sh"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    options = {"endpoint_url": f"http://127.0.0.1:{port}"}
    try:
        wait_for(lambda: _answers(port), 30, "the S3 server")
        s3_filesystem(options).mkdir("pexec-test")
        yield options
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def mem_root() -> Iterator[str]:
    """A fresh folder on fsspec's in-memory filesystem, removed afterwards."""
    root = f"memory://t-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
