"""The code version is per environment: the scoring core plus each family's own code. Editing the τ family leaves
every other family's version (and the core's) alone; editing the checker changes the core, so a rescore reuses
exactly the shards a change does not affect, and the manifest says why for each shard."""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pipeline.scoring import _code_version as cv
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package's source (same relative paths: the same hashes as the installed package)."""
    copy = tmp_path / "pipeline"
    shutil.copytree(cv.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def touch(path: Path) -> None:
    path.write_text(path.read_text() + "\n# edited\n")


def test_editing_one_family_changes_its_version_only(tree: Path) -> None:
    before = cv.versions(tree)
    assert before == cv.versions(cv.PACKAGE_ROOT)
    assert {"bfcl", "tau", "spec", "toolsandbox", "observed"} <= set(before)
    touch(tree / "envs" / "tau" / "env.py")
    after = cv.versions(tree)
    assert {k for k in before if before[k] != after[k]} == {"tau"}
    touch(tree / "envs" / "spec" / "loader.py")  # imported by the τ, ToolSandbox and observed families too
    assert {k for k, v in cv.versions(tree).items() if after[k] != v} == {"spec", "tau", "toolsandbox", "observed"}


def test_editing_the_core_changes_the_core_version(tree: Path) -> None:
    before = cv.versions(tree)
    touch(tree / "replay" / "checker.py")
    after = cv.versions(tree)
    assert after["core"] != before["core"] and {k for k in before if before[k] != after[k]} == {"core"}
    touch(tree / "report" / "_html.py")  # not executed by scoring: no version changes
    assert cv.versions(tree) == after


def test_the_core_and_the_families_cover_what_scoring_executes() -> None:
    core = {p.relative_to(cv.PACKAGE_ROOT).as_posix() for p in cv.core_sources()}
    assert {"scoring/shard.py", "replay/checker.py", "core/records.py", "expr/__init__.py", "envs/_rules.py"} <= core
    assert not any(p.startswith(("envs/tau/", "envs/bfcl/", "envs/spec/", "envs/toolsandbox/")) for p in core)
    assert "envs/bfcl/_wheel_import.py" in {
        p.relative_to(cv.PACKAGE_ROOT).as_posix() for p in cv.family_sources("bfcl")
    }


@pytest.fixture(autouse=True)
def _versions_of_the_real_tree_afterwards() -> Iterator[None]:
    """The versions cached while a test versioned a copy are dropped after it: a later test in this process (a
    worker runs several files) must see the package's own versions, as a `pexec` it starts does."""
    yield
    cv.code_version.cache_clear()
    cv.family_version.cache_clear()


def use_tree(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Version the package as if its source were the tree at `root` (the hashes are read from there)."""
    monkeypatch.setattr(cv, "PACKAGE_ROOT", root)
    cv.code_version.cache_clear()
    cv.family_version.cache_clear()


def observed_records(n: int) -> list[dict]:
    return [
        {"rollout_id": f"o{i}", "task_id": f"t{i % 5}", "benchmark": "observed", "success": True,
         "events": [{"type": "message", "role": "user", "content": "hi"},
                    {"type": "call", "tool": "lookup", "arguments": {"q": "x"}, "output": "ok"}]}
        for i in range(n)
    ]  # fmt: skip


def reuse(run: Path) -> dict[str, tuple[bool, str]]:
    manifest = orjson.loads((run / "_manifest.json").read_bytes())
    return {s["shard"]: (s["reused"], s["why"]) for s in manifest["reuse"]["shards"]}


def test_a_rescore_reuses_the_shards_a_change_does_not_affect(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, run = tmp_path / "store", tmp_path / "run"
    write_store(iter(synthesize("shop", 60, 10, 1)), str(store / "shop"))
    write_store(iter(observed_records(20)), str(store / "observed"))
    use_tree(monkeypatch, tree)
    first = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert first.counts.scored == 80 and first.counts.shards_reused == 0
    shards = {s.shard: set(s.environments) for s in first.shards}
    shop = next(k for k, e in shards.items() if e == {"shop"})
    observed = next(k for k, e in shards.items() if e == {"observed"})
    assert "; code spec@" in first.environments["shop"]

    touch(tree / "envs" / "tau" / "env.py")  # the τ family: no shard here uses it
    use_tree(monkeypatch, tree)
    assert {k: r for k, (r, _) in reuse(run).items()} == {shop: False, observed: False}  # (the first run's record)
    run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert {k: r for k, (r, _) in reuse(run).items()} == {shop: True, observed: True}
    assert reuse(run)[shop][1] == "input, scoring core, settings and environments (shop) unchanged"

    touch(tree / "envs" / "spec" / "env.py")  # the spec family: the shop shard only
    use_tree(monkeypatch, tree)
    run_scoring(str(store), str(run), ScoreSettings(inline=True))
    why = reuse(run)
    assert why[observed][0] and not why[shop][0]
    assert why[shop][1].startswith("environment shop changed (") and "; code spec@" in why[shop][1]

    touch(tree / "replay" / "checker.py")  # the scoring core: every shard
    use_tree(monkeypatch, tree)
    last = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert last.counts.shards_reused == 0
    assert all(not r and w.startswith("scoring core changed (") for r, w in reuse(run).values())


def _names_by_full_parse(source: bytes) -> tuple[str, ...]:
    """What the code version's import scan must find: every import statement of the whole module's syntax tree."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return tuple(sorted(names))


def test_the_import_scan_finds_what_a_full_parse_finds_in_every_module_of_the_package() -> None:
    # It may find more (an example in a docstring), which only hashes more code; never less.
    files = sorted(cv.PACKAGE_ROOT.rglob("*.py"))
    assert len(files) > 150
    for path in files:
        source = path.read_bytes()
        assert set(cv._imported_names(source)) >= set(_names_by_full_parse(source)), path


def test_the_import_scan_reads_every_form_an_import_takes() -> None:
    source = b'''"""A docstring that mentions
import of something and
from the logs import nothing
"""
import pipeline.a, pipeline.b as b
from pipeline.c import (  # a comment with a ) in it
    d,  # and ( here
    e as f,
)
from pipeline.g import \\
    h
from . import relative


def lazy() -> None:
    if True:
        from pipeline.i import j
    try:
        import pipeline.k
    except ImportError:
        pass
'''
    found = set(cv._imported_names(source))
    assert found == set(_names_by_full_parse(source))
    assert {"pipeline.a", "pipeline.b", "pipeline.c.d", "pipeline.c.e", "pipeline.g.h", "pipeline.i.j"} <= found
    assert "pipeline.k" in found
