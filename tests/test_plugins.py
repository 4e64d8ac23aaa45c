"""A package outside pexec adds a log format (entry point `pexec.ingest`) and an environment (entry point
`pexec.environments`): built as a wheel, installed into a throw-away folder (never the venv) and found by
importlib.metadata from its .dist-info on PYTHONPATH, it is read, listed and scored through the `pexec` console
script like a built-in. Its broken and wrong entry points are refused the same way for both kinds, in one line
naming the package. Listing the plug-ins imports none; a name that did not resolve is not looked up again; every
built-in is of its kind. Then the options of every format are checked in one place, with one message."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from pipeline.core import plugins
from pipeline.core.plugins import declared
from pipeline.envs import EnvError, Environment, get_environment
from pipeline.envs import _registry as env_registry
from pipeline.ingest import IngestError, IngestOptions, LogFormat, accepted_options, formats, get_format, ingest
from pipeline.ingest import registry as format_registry
from pipeline.ingest.base import ReadLimits

ROOT = Path(__file__).resolve().parents[1]

PYPROJECT = """\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["_build"]

[project]
name = "pexec-lights"
version = "0.1"

[project.entry-points."pexec.ingest"]
lights_log = "pexec_lights:FORMAT"
broken = "pexec_lights:NO_SUCH_FORMAT"
not_a_format = "pexec_lights:PRESS"
misnamed = "pexec_lights:FORMAT"

[project.entry-points."pexec.environments"]
lights = "pexec_lights:environment"
broken_env = "pexec_lights_broken:environment"
not_a_factory = "pexec_lights:PRESS"
dark = "pexec_lights:environment"
half = "pexec_lights:half"
"""

# The plug-in itself: a log format whose lines are {"id", "presses": [bool, ...], "ok"} and an environment whose
# one tool, `press(on)`, refuses to turn on a light that is on (or off one that is off).
MODULE = '''\
"""Lights: a log format and an environment from outside pexec."""

import json

from pipeline.envs import Outcome, ToolInfo
from pipeline.ingest import IngestError, LogFormat, Option, OptionSchema, source_files


class LightsLog(LogFormat):
    name = "lights_log"
    options = OptionSchema((Option("shift", "the `shift` label", "day"),))

    def looks_like(self, doc):
        return isinstance(doc, dict) and isinstance(doc.get("presses"), list)

    def read(self, sources, options):
        for source in sources:
            for url in source_files("lights_log", source, options, ("*.jsonl",)):
                with open(url, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        doc = json.loads(line)
                        if not self.looks_like(doc):
                            raise IngestError(f"lights_log: {url} line {number}: no 'presses' list")
                        presses = [{"type": "call", "tool": "press", "arguments": {"on": on}} for on in doc["presses"]]
                        yield {
                            "rollout_id": doc["id"],
                            "task_id": doc["id"],
                            "benchmark": "lights",
                            "labels": {"shift": options.extra["shift"], **options.labels},
                            "events": presses,
                            "success": doc["ok"],
                        }


FORMAT = LightsLog()
PRESS = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}


class Lights:
    name = "lights"
    version = "0.1"
    simulated = True
    _tools = {"press": ToolInfo.from_schema("press", PRESS, frozenset())}

    def tool(self, name):
        return self._tools.get(name)

    def open_catalogue(self):
        return False

    def start(self, rollout):
        return {"on": False}

    def knowledge(self, state):
        return []

    def available(self, state, tool, turn):
        return True

    def execute(self, state, tool, args, call):
        if args["on"] == state["on"]:
            return Outcome(False, message=f"the light is already {'on' if state['on'] else 'off'}")
        state["on"] = args["on"]
        return Outcome(True, output="click")

    def checkpoint(self, state):
        return dict(state)

    def rollback(self, state, mark):
        state.update(mark)


def environment(options):
    return Lights()


class Half:
    """Lights without checkpoint and rollback: not an environment."""

    name = "half"
    version = "0.1"
    simulated = True
    tool, open_catalogue, start, knowledge = Lights.tool, Lights.open_catalogue, Lights.start, Lights.knowledge
    available, execute = Lights.available, Lights.execute


def half(options):
    return Half()
'''
BROKEN_MODULE = """raise RuntimeError("the simulator of this package is not installed")
"""

# The venv's setuptools (65.5, what Python 3.11 bundles) builds no wheel without the `wheel` package, and the test
# must not reach a package index: the package brings its own build backend (PEP 517 `backend-path`), which writes
# the wheel as the binary distribution format says, entry points taken from pyproject.toml.
BACKEND = r"""
import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    name, version = project["name"].replace("-", "_"), project["version"]
    info = f"{name}-{version}.dist-info"
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in project["entry-points"].items()
    )
    files = {p.name: p.read_bytes() for p in sorted(Path().glob("*.py"))}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test_plugins\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip('=')},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,", ""]).encode()
    wheel = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel
"""


def install_plugin(tmp_path: Path) -> Path:
    """The plug-in package built and installed into a folder of its own; returns that folder."""
    source = tmp_path / "pexec-lights"
    (source / "_build").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "pexec_lights.py").write_text(MODULE)
    (source / "pexec_lights_broken.py").write_text(BROKEN_MODULE)
    (source / "_build" / "backend.py").write_text(textwrap.dedent(BACKEND))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--no-cache-dir", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist")]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=120)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    assert (target / "pexec_lights-0.1.dist-info" / "entry_points.txt").is_file()
    return target


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(tmp_path_factory.mktemp("plugin"))


def subprocess_env(site: Path) -> dict[str, str]:
    # this checkout first (the console script would otherwise import where the venv's editable install points)
    return {"PATH": os.environ["PATH"], "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}


def pexec_in(site: Path, cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """`pexec ARGS` with the plug-in installed, which must succeed (`ok`) or fail."""
    pexec = str(Path(sys.executable).with_name("pexec"))
    proc = subprocess.run(
        [pexec, *args], capture_output=True, text=True, timeout=120, env=subprocess_env(site), cwd=cwd
    )
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc


def test_an_outside_package_adds_a_log_format_and_an_environment(site: Path, tmp_path: Path) -> None:
    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        return pexec_in(site, tmp_path, *args, ok=ok)

    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        {"id": "steady", "presses": [True, False, True], "ok": True},
        {"id": "double", "presses": [True, True, False], "ok": False},  # the second press finds the light on
    ]
    (logs / "night.jsonl").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in lines))

    # the format: read with a declared option, its options listed from its schema
    wrote = run("ingest", "lights_log", str(logs), "--out", "store", "--option", "shift=night").stderr
    assert "wrote 2 rollouts" in wrote
    lines_read = [line for f in sorted((tmp_path / "store").glob("*.jsonl")) for line in f.read_bytes().splitlines()]
    labels = {r["rollout_id"]: r["labels"] for r in map(orjson.loads, lines_read)}
    assert labels == {"steady": {"shift": "night"}, "double": {"shift": "night"}}
    listed = run("ingest", "lights_log", str(logs), "--out", "unused", "--option", "help").stdout
    assert re.search(r"shift\s+│\s+day\s+│ the `shift` label", listed) and "allow_no_calls" in listed
    assert not (tmp_path / "unused").exists()
    # its option checked by pexec, in the one message form of every format
    bad = run("ingest", "lights_log", str(logs), "--out", "s2", "--option", "colour=red", ok=False).stderr
    known = ", ".join(sorted(["allow_no_calls", *(f"max_{f.name}" for f in dataclasses.fields(ReadLimits)), "shift"]))
    assert bad.strip() == f"error: lights_log: unknown option(s) colour (known: {known})"
    # a built-in format's reader given these logs names the outside format
    stray = run("ingest", "openai", str(logs), "--out", "s3", ok=False).stderr
    assert "expected an object with a 'messages' list (it looks like lights_log logs: pexec ingest lights_log)" in stray
    # a broken entry point: one line naming its package
    broken = run("ingest", "broken", str(logs), "--out", "s4", ok=False).stderr.strip()
    assert broken == (
        "error: log format 'broken': the entry point pexec_lights:NO_SUCH_FORMAT of package "
        "pexec-lights 0.1 fails: AttributeError: module 'pexec_lights' has no attribute 'NO_SUCH_FORMAT'"
    )

    # the environment: listed with where it comes from, and scoring the store
    assert re.search(r"lights\s+│ entry point pexec_lights:environment", run("envs").stdout)
    run("score", "store", "--out", "run", "--inline")
    steps = pq.read_table(tmp_path / "run" / "steps").to_pylist()
    verdicts = {(s["rollout_id"], s["step"]): (s["valid"], s["failed_check"], s["detail"]) for s in steps}
    assert verdicts == {
        ("steady", 1): (True, None, None),
        ("steady", 2): (True, None, None),
        ("steady", 3): (True, None, None),
        ("double", 1): (True, None, None),
        ("double", 2): (False, "P", "the light is already on"),
        ("double", 3): (True, None, None),
    }
    rollouts = {
        r["rollout_id"]: (r["fed"], r["executable"]) for r in pq.read_table(tmp_path / "run" / "rollouts").to_pylist()
    }
    assert rollouts == {"steady": (4, True), "double": (2, False)}  # the first error at depth 2


# (command, the one line it fails with); STORE is a store of the lights rollouts. Each kind's entry point is
# refused the same way: one that fails to load, one that loads something else, and for an environment a factory
# that builds something that is not the environment it is named for.
PLUGIN = "of package pexec-lights 0.1"
REFUSED = [
    (
        ["score", "STORE", "--out", "run", "--inline", "--env", "broken_env"],
        f"environment 'broken_env': the entry point pexec_lights_broken:environment {PLUGIN} fails: "
        "RuntimeError: the simulator of this package is not installed",
    ),
    (
        ["ingest", "not_a_format", "logs", "--out", "s"],
        f"log format 'not_a_format': the entry point pexec_lights:PRESS {PLUGIN} is not a pipeline.ingest.LogFormat "
        "named 'not_a_format'",
    ),
    (
        ["ingest", "misnamed", "logs", "--out", "s"],
        f"log format 'misnamed': the entry point pexec_lights:FORMAT {PLUGIN} is not a pipeline.ingest.LogFormat "
        "named 'misnamed'",
    ),
    (
        ["score", "STORE", "--out", "run", "--inline", "--env", "not_a_factory"],
        f"environment 'not_a_factory': the entry point pexec_lights:PRESS {PLUGIN} is not an environment factory, a "
        "callable (EnvOptions) -> Environment",
    ),
    (
        ["score", "STORE", "--out", "run", "--inline", "--env", "dark"],
        f"environment 'dark': the entry point pexec_lights:environment {PLUGIN} builds a Lights named 'lights', not "
        "a pipeline.envs.Environment named 'dark'",
    ),
    (
        ["score", "STORE", "--out", "run", "--inline", "--env", "half"],
        f"environment 'half': the entry point pexec_lights:half {PLUGIN} builds a Half without checkpoint, rollback, "
        "not a pipeline.envs.Environment named 'half'",
    ),
]


ROLLOUT = {"rollout_id": "r1", "task_id": "t1", "benchmark": "lights", "success": True,
           "events": [{"type": "call", "tool": "press", "arguments": {"on": True}}]}  # fmt: skip


@pytest.mark.parametrize(("args", "line"), REFUSED, ids=[a[-1] if a[0] == "score" else a[1] for a, _ in REFUSED])
def test_a_broken_or_wrong_entry_point_is_refused_in_one_line(site: Path, tmp_path: Path, args: list, line: str):
    for folder, record in [("logs", {"id": "r1", "presses": [True], "ok": True}), ("store", ROLLOUT)]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part-0.jsonl").write_bytes(orjson.dumps(record) + b"\n")
    args = ["store" if a == "STORE" else a for a in args]
    assert pexec_in(site, tmp_path, *args, ok=False).stderr.strip() == f"error: {line}"
    assert not (tmp_path / "s").exists() and not (tmp_path / "run" / "_manifest.json").exists()


# The modules a listing must not import: every adapter and family, the simulators, and the plug-in package.
ADAPTERS = [f"pipeline.ingest.{name}" for name in format_registry.BUILT_IN] + [
    "pipeline.envs.bfcl",
    "pipeline.envs.tau",
    "pipeline.envs.toolsandbox",
    "pipeline.envs.observed",
    "bfcl_eval",
    "tau2",
    "pexec_lights",
]
LISTING = """
import sys
from pipeline.envs import get_environment, list_environments
from pipeline.ingest import formats, get_format

listed = (formats(), sorted(list_environments()))
for unknown in (lambda: get_format("nope"), lambda: get_environment("nope")):
    try:
        unknown()
    except Exception as exc:
        print(exc)
print(listed)
print(sorted(m for m in sys.modules if m in ADAPTERS))
"""


def test_listing_the_plugins_and_an_unknown_name_import_no_adapter(site: Path) -> None:
    code = LISTING.replace("ADAPTERS", repr(ADAPTERS))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=subprocess_env(site), check=True)  # fmt: skip
    format_error, env_error, listed, imported = proc.stdout.splitlines()
    assert format_error.startswith("unknown format 'nope' (available: anthropic, bfcl, broken, canonical, ")
    assert env_error.startswith("unknown environment 'nope': not registered (bfcl_v3, bfcl_v4, observed, ")
    assert "'lights_log'" in listed and "'lights'" in listed and "'tau_airline'" in listed
    assert imported == "[]"


def test_a_name_that_did_not_resolve_is_not_looked_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of an unknown benchmark (or format) are many: the entry points are read once, not per record, and
    the error raised again each time does not grow a traceback; a new scoring run (`forget_unresolved`) looks
    again."""
    reads = []

    def counted(**kw):
        reads.append(kw["group"])
        return []

    monkeypatch.setattr(plugins, "entry_points", counted)
    env_registry.forget_unresolved()
    format_registry.FORMATS.forget()
    depths = []
    for _ in range(50):
        with pytest.raises(EnvError, match="unknown environment 'nowhere'") as env_info:
            get_environment("nowhere")
        with pytest.raises(IngestError, match="unknown format 'nowhere'"):
            get_format("nowhere")
        depths.append(len(traceback.extract_tb(env_info.value.__traceback__)))
    assert reads == ["pexec.environments", "pexec.ingest"] and len(set(depths[1:])) == 1
    env_registry.forget_unresolved()
    with pytest.raises(EnvError):
        get_environment("nowhere")
    assert reads == ["pexec.environments", "pexec.ingest", "pexec.environments"]
    monkeypatch.undo()
    env_registry.forget_unresolved()
    format_registry.FORMATS.forget()


@pytest.mark.parametrize("name", format_registry.BUILT_IN)
def test_every_built_in_format_is_a_log_format_with_every_member(name: str) -> None:
    fmt = get_format(name)
    assert isinstance(fmt, LogFormat) and fmt.name == name and not inspect.isabstract(type(fmt))
    assert all(hasattr(fmt, m) for m in declared(LogFormat))
    assert set(declared(LogFormat)) == {"name", "options", "reads_files", "shuffle", "looks_like", "read", "plan",
                                        "read_shard", "read_rollouts", "resolve"}  # fmt: skip
    # a format that plans shards reads each by read_shard or shuffles its items, one or the other
    planned = type(fmt).plan is not LogFormat.plan
    reads_shards = type(fmt).read_shard is not LogFormat.read_shard
    assert planned == (reads_shards or fmt.shuffle is not None) and not (reads_shards and fmt.shuffle is not None)


@pytest.mark.parametrize("name", sorted(env_registry.BUILT_IN))
def test_every_built_in_environment_is_an_environment_with_every_member(name: str) -> None:
    env = get_environment(name)
    assert isinstance(env, Environment) and env.name == name
    methods = [m for m in declared(Environment) if m not in ("name", "version", "simulated")]
    assert methods == ["tool", "open_catalogue", "start", "knowledge", "available", "execute", "checkpoint", "rollback"]
    assert all(callable(getattr(env, m)) for m in methods)
    assert isinstance(env.version, str) and env.version and isinstance(env.simulated, bool)


LOGS = "allow_no_calls, benchmark, id_field, outcomes, success_field, task_field, label.NAME, attr.NAME"


@pytest.mark.parametrize(
    ("fmt", "known"),
    [
        ("bfcl", "allow_no_calls, dataset, model, scores"),
        ("tau2", "allow_no_calls, tasks, tau2_python, tau2_source"),
        ("toolsandbox", "allow_no_calls, now, threshold, tz"),
        ("openai", LOGS.replace("benchmark,", "benchmark, error_prefix,")),
        ("anthropic", LOGS),
        ("otel", LOGS),
        ("inspect", LOGS.replace("outcomes,", "outcomes, scorer,")),
        ("canonical", "allow_no_calls"),
    ],
)
def test_every_format_refuses_an_unknown_option_before_reading(tmp_path: Path, fmt: str, known: str) -> None:
    # the read limits are options of every format, listed in sorted order with the others
    keys = known.split(", ")
    limits = [f"max_{f.name}" for f in dataclasses.fields(ReadLimits)]
    plain = sorted([k for k in keys if not k.endswith(".NAME")] + limits)
    known = ", ".join(plain + [k for k in keys if k.endswith(".NAME")])
    extra = {"nope": "1", "label.x": "y", "labels.z": "w"}
    with pytest.raises(IngestError) as info:
        list(ingest(fmt, [str(tmp_path / "missing")], IngestOptions(extra=extra)))
    unknown = "labels.z, nope" if "label.NAME" in known else "label.x, labels.z, nope"
    assert str(info.value) == f"{fmt}: unknown option(s) {unknown} (known: {known})"
    assert {o.key for o in accepted_options(fmt).listed()} == set(known.split(", "))
    assert set(formats()) >= {fmt}


def test_declared_defaults_reach_the_reader(tmp_path: Path) -> None:
    """toolsandbox's threshold and tz come from its schema, and the option overrides them."""
    run = ROOT / "tests" / "data" / "toolsandbox"
    defaults = {r["task_id"]: (r["env"]["tz"], r["success"]) for r in ingest("toolsandbox", [str(run)])}
    lenient = IngestOptions(extra={"threshold": "0.5", "tz": "Europe/Paris"})
    given = {r["task_id"]: (r["env"]["tz"], r["success"]) for r in ingest("toolsandbox", [str(run)], lenient)}
    assert {tz for tz, _ in defaults.values()} == {"UTC"} and {tz for tz, _ in given.values()} == {"Europe/Paris"}
    assert sum(ok is True for _, ok in given.values()) > sum(ok is True for _, ok in defaults.values())
    declared = {o.key: o.default for o in accepted_options("toolsandbox").listed()}
    assert (declared["threshold"], declared["tz"], declared["now"]) == ("1.0", "UTC", None)
