"""The package's shape: stages are rooms (`pipeline/<room>/`, and what users run in one wing of rooms,
`pipeline/apps/<room>/`), each room's docstring says which rooms it may import ("Imports: …"), and the code keeps to
it — every import counted, lazy and type-only ones included — with no cycle between modules, and no module reaching
into another room's internal modules (`_x.py`)."""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
WING = "apps"  # the folder of the rooms users run: `pipeline/apps/<room>/`
MAX_ROOMS = 20
# The stages as a newcomer reads them, each room after every room it may import.
PIPELINE_ORDER = ["core", "storage", "expr", "envs", "replay", "ingest", "synthetic", "scoring", "metrics",
                  "report", "web", "view", "guard", "drafting", "jobs", "integrations", "perf", "cli"]  # fmt: skip


def room_folders() -> dict[str, Path]:
    """room -> its folder: every package under pipeline/ but the wing, and every package in the wing."""
    stages = {p.parent.name: p.parent for p in PACKAGE.glob("*/__init__.py") if p.parent.name != WING}
    return stages | {p.parent.name: p.parent for p in (PACKAGE / WING).glob("*/__init__.py")}


def rooms() -> dict[str, set[str]]:
    """room -> the rooms its docstring says it may import."""
    folders = room_folders()
    found = sorted(folders)
    declared: dict[str, str] = {}
    for room in found:
        doc = ast.get_docstring(ast.parse((folders[room] / "__init__.py").read_text(encoding="utf-8"))) or ""
        match = re.search(r"^Imports: (.+?)\.?$", doc, re.M)
        assert match, f"{folders[room]}/__init__.py: its docstring says what it may import ('Imports: …')"
        declared[room] = match[1]
    allowed = {}
    for room, text in declared.items():
        if text == "nothing of pexec":
            allowed[room] = set()
        elif every := re.fullmatch(r"every stage(?: but (.+))?", text):
            left_out = {*re.split(r", | and ", every[1] or ""), room}
            allowed[room] = {r for r in found if r not in left_out}
        else:
            allowed[room] = set(re.split(r", ", text))
            unknown = allowed[room] - set(found)
            assert not unknown, f"pipeline/{room}: 'Imports:' names {unknown}, which are not rooms"
    return allowed


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = [PACKAGE.name, *path.relative_to(PACKAGE).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module name) of every import of the package in `path`, wherever it stands; an import inside an
    `except ImportError` handler (a fallback for another version of the package) is not one of this layout's."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fallback = {id(n) for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) for n in ast.walk(h)}
    found = []
    for node in ast.walk(tree):
        if id(node) in fallback:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}:{node.lineno}: relative import; the package imports by full name")
    return [(line, name) for line, name in found if name.split(".")[0] == PACKAGE.name]


def resolve(name: str, known: dict[str, Path]) -> str:
    """The module an imported name lives in (`pipeline.core.model.Call` -> `pipeline.core.model`)."""
    while name not in known:
        name = name.rpartition(".")[0]
    return name


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] == WING:
        return parts[2] if len(parts) > 2 else ""
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""


def test_the_rooms_stand_in_pipeline_order_and_none_may_import_a_later_one() -> None:
    allowed = rooms()
    assert len(allowed) <= MAX_ROOMS, sorted(allowed)
    assert sorted(PIPELINE_ORDER) == sorted(allowed), "PIPELINE_ORDER lists every room once"
    for room, may in allowed.items():
        later = sorted(r for r in may if PIPELINE_ORDER.index(r) >= PIPELINE_ORDER.index(room))
        assert not later, f"pipeline/{room} may import {later}, which stand at or after it in the pipeline"


def test_every_import_keeps_to_its_rooms_declaration() -> None:
    allowed = rooms()
    known = modules()
    wrong = []
    for module, path in known.items():
        source = room_of(module)
        for line, name in imports(path):
            target = room_of(resolve(name, known))
            if source and target and target != source and target not in allowed[source]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({source}) imports {name} ({target})")
            if source and not target and name not in (PACKAGE.name, f"{PACKAGE.name}.{WING}"):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({source}) imports {name} outside any room")
    assert not wrong, "\n".join(wrong)


def test_no_room_imports_another_rooms_internal_modules() -> None:
    """A module named `_x.py` is its room's own: other rooms import what the room's package or its public modules
    export."""
    known = modules()
    wrong = []
    for module, path in known.items():
        source = room_of(module)
        for line, name in imports(path):
            target_module = resolve(name, known)
            internal = any(part.startswith("_") and not part.startswith("__") for part in target_module.split("."))
            if internal and room_of(target_module) != source:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({source}) imports {target_module}")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_itself_back_through_others() -> None:
    known = modules()
    graph = {m: {resolve(name, known) for _, name in imports(path)} - {m} for m, path in known.items()}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_checks_see_a_back_arrow_and_a_cycle(tmp_path: Path) -> None:
    """The checks above can fail: an import of a later room, and two modules importing each other."""
    back = tmp_path / "back.py"
    back.write_text("def f():\n    from pipeline.report import build_report\n")
    [(line, name)] = imports(back)
    assert (line, name) == (2, "pipeline.report.build_report")
    assert room_of(resolve(name, modules())) == "report" and "report" not in rooms()["metrics"]
    graph = {"a": {"b"}, "b": {"a"}}
    with pytest.raises(CycleError):
        list(TopologicalSorter(graph).static_order())
