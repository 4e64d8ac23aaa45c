"""A package outside pexec adds a log format (entry point `pexec.ingest`) and an environment (entry point
`pexec.environments`): built as a wheel, installed into a throw-away folder (never the venv) and found by
importlib.metadata from its .dist-info on PYTHONPATH, it is read, listed and scored through the `pexec` console
script like a built-in. Then the options of every format are checked in one place, with one message."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from pipeline.ingest import IngestError, IngestOptions, accepted_options, formats, ingest

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

[project.entry-points."pexec.environments"]
lights = "pexec_lights:environment"
"""

# The plug-in itself: a log format whose lines are {"id", "presses": [bool, ...], "ok"} and an environment whose
# one tool, `press(on)`, refuses to turn on a light that is on (or off one that is off).
MODULE = '''\
"""Lights: a log format and an environment from outside pexec."""

import json

from pipeline.envs import Outcome, ToolInfo
from pipeline.ingest import Format, IngestError, Option, OptionSchema, source_files


def read(sources, options):
    for source in sources:
        for url in source_files("lights_log", source, options, ("*.jsonl",)):
            with open(url, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    doc = json.loads(line)
                    if not looks_like(doc):
                        raise IngestError(f"lights_log: {url} line {number}: no 'presses' list")
                    yield {
                        "rollout_id": doc["id"],
                        "task_id": doc["id"],
                        "benchmark": "lights",
                        "labels": {"shift": options.extra["shift"], **options.labels},
                        "events": [{"type": "call", "tool": "press", "arguments": {"on": on}} for on in doc["presses"]],
                        "success": doc["ok"],
                    }


def looks_like(doc):
    return isinstance(doc, dict) and isinstance(doc.get("presses"), list)


FORMAT = Format("lights_log", read, OptionSchema((Option("shift", "the `shift` label", "day"),)), looks_like)
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
'''

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


def test_an_outside_package_adds_a_log_format_and_an_environment(tmp_path: Path) -> None:
    site = install_plugin(tmp_path)
    pexec = str(Path(sys.executable).with_name("pexec"))
    # this checkout first (the console script would otherwise import where the venv's editable install points)
    env = {"PATH": os.environ["PATH"], "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([pexec, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert (proc.returncode == 0) == ok, proc.stderr
        return proc

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
    known = "allow_no_calls, max_line_bytes, max_member_bytes, max_record_bytes, shift"
    assert bad.strip() == f"error: lights_log: unknown option(s) colour (known: {known})"
    # a built-in format's reader given these logs names the outside format
    stray = run("ingest", "openai", str(logs), "--out", "s3", ok=False).stderr
    assert "expected an object with a 'messages' list (it looks like lights_log logs: pexec ingest lights_log)" in stray
    # a broken entry point: one line naming its package
    broken = run("ingest", "broken", str(logs), "--out", "s4", ok=False).stderr.strip()
    assert broken.startswith("error: log format 'broken': the entry point pexec_lights:NO_SUCH_FORMAT of package "
                             "pexec-lights 0.1 fails: ") and "\n" not in broken  # fmt: skip

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


LOGS = "allow_no_calls, benchmark, id_field, outcomes, success_field, task_field, label.NAME, attr.NAME"


@pytest.mark.parametrize(
    ("fmt", "known"),
    [
        ("bfcl", "allow_no_calls, dataset, model, scores"),
        ("tau2", "allow_no_calls, tasks"),
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
    plain = sorted(
        [k for k in keys if not k.endswith(".NAME")] + ["max_line_bytes", "max_member_bytes", "max_record_bytes"]
    )
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
