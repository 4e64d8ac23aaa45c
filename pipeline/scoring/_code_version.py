"""The code versions of scoring: what decides whether an earlier run's scored shards can be reused.

The code version is per environment: the scoring core plus that environment family's own code, so a change
rescores only what it affects.
- The **core** version (`code_version()`) is the package version plus a hash of the source every shard executes
  whatever its environments: `scoring/shard.py`, the modules of `envs/` that are not a family (the protocol, the
  registry, the rule engine, the data paths), and every package module these import, followed through their
  `import` statements (lazy ones inside functions included) but never into a family. A shard scored under
  another core version is rescored.
- A **family** version (`family_version(name)`) hashes one environment family's own files (a folder of `envs/`,
  or `envs/observed.py`) and the package modules they import that the core does not already cover. It is recorded
  beside each environment's own version (`environment_version`: spec and data fingerprints, simulator pins), so
  editing the τ family rescores the τ shards and reuses every BFCL and spec shard.
Editing the report, the DuckDB stage, ingest or the CLI keeps every scored shard reusable.
"""

from __future__ import annotations

import ast
import hashlib
import re
from functools import cache
from importlib.metadata import version
from pathlib import Path

from pipeline.envs.base import Environment

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # pipeline/
_NAME = PACKAGE_ROOT.name
_FAMILY_MODULES = ("observed.py",)  # single-module families directly under envs/ (the rest are folders)


@cache
def code_version() -> str:
    """The core version: `<package version>+<hash of the core sources>`."""
    return f"{version('pexec')}+{_digest(core_sources(PACKAGE_ROOT), PACKAGE_ROOT)}"


@cache
def family_version(family: str) -> str:
    """The hash of one family's own code (`""` for a name that is no family of this package)."""
    return _family_digest(family, PACKAGE_ROOT)


def environment_version(env: Environment) -> str:
    """What a shard records for an environment: its own version (data, pins) and its family's code version (the
    family of its class's module). A third-party environment's code is its own version's business: only that is
    recorded."""
    family = family_of(type(env).__module__)
    return f"{env.version}; code {family}@{family_version(family)}" if family else env.version


def family_of(module: str) -> str | None:
    """The family of a module path (`pipeline.envs.tau.env` -> `tau`), None outside the package's families."""
    parts = module.split(".")
    if parts[:2] != [_NAME, "envs"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in _own_families() or f"{parts[2]}.py" in _FAMILY_MODULES else None


@cache
def _own_families() -> frozenset[str]:
    """This package's family names, listed once per process: a shard asks for every rollout it scores, and its
    files do not change under a running process (its code version is taken once too)."""
    return frozenset(families(PACKAGE_ROOT))


def families(root: Path) -> dict[str, list[Path]]:
    """Family name -> its own files, under the package at `root`."""
    envs = root / "envs"
    found = {p.name: sorted(p.rglob("*.py")) for p in sorted(envs.iterdir()) if (p / "__init__.py").is_file()}
    found |= {Path(m).stem: [envs / m] for m in _FAMILY_MODULES if (envs / m).is_file()}
    return found


def core_sources(root: Path | None = None) -> set[Path]:
    """The package's source files (under `root`) every shard can execute, whatever its environments."""
    root = root or PACKAGE_ROOT
    own = {f for files in families(root).values() for f in files}
    start = [root / "scoring" / "shard.py", *(p for p in (root / "envs").glob("*.py") if p not in own)]
    return _closure(start, root, stop=own)


def family_sources(family: str, root: Path | None = None) -> set[Path]:
    """One family's files and the modules they import, not followed into the core (the registry every family
    imports) but followed into another family that this one imports itself."""
    root = root or PACKAGE_ROOT
    files = families(root).get(family, [])
    return _closure(files, root, stop=core_sources(root)) if files else set()


def scoring_sources(root: Path | None = None) -> set[Path]:
    """Every source file scoring can execute: the core and every family."""
    root = root or PACKAGE_ROOT
    return core_sources(root).union(*(family_sources(f, root) for f in families(root)))


def versions(root: Path | None = None) -> dict[str, str]:
    """The hashes of the package at `root` (default: this one): `core` and one per family."""
    root = root or PACKAGE_ROOT
    return {"core": _digest(core_sources(root), root)} | {f: _family_digest(f, root) for f in families(root)}


def _family_digest(family: str, root: Path) -> str:
    files = family_sources(family, root)
    return _digest(files, root) if files else ""


def _digest(files: set[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _closure(start: list[Path], root: Path, stop: set[Path]) -> set[Path]:
    """`start` and the package files they import, transitively, never entering a file of `stop`."""
    pending = list(start)
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path not in seen and path not in stop:
            seen.add(path)
            pending += _imported_files(path, root)
    return seen


def _imported_files(path: Path, root: Path) -> list[Path]:
    files = []
    for name in _imported_names(path.read_bytes()):
        parts = name.split(".")
        if parts[0] == _NAME and len(parts) > 1:
            base = root.joinpath(*parts[1:])
            files += [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()]
    return files


@cache  # by content: a file is read by several closures (the core's, then each family's)
def _imported_names(source: bytes) -> tuple[str, ...]:
    """The modules a source file imports, lazy imports inside functions included. Only the statements that can be
    imports are parsed, not the whole file: this runs in every process that scores (the driver, each Ray worker),
    and parsing every module the closure reaches cost about 0.1 s of CPU in each. The package's lint forbids two
    statements on one line, so every import starts a line; a line of a docstring that reads like one adds a
    name at worst, which only hashes more code (tests/test_code_versions.py compares this with a full parse)."""
    names: list[str] = []
    for match in _IMPORT_LINE.finditer(source):
        node = _statement(source, match.start(1))
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:  # an absolute `from … import …`
            # `from pipeline.envs import bfcl` may name a module or a member: try both
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return tuple(names)


_IMPORT_LINE = re.compile(rb"^[ \t]*((?:import|from)[ \t])", re.MULTILINE)


def _statement(source: bytes, start: int) -> ast.stmt | None:
    """The statement starting at `start`: its first line, or as many lines as it takes to parse (a parenthesised
    list, a backslash); None when no run of up to `_MAX_LINES` lines there parses (prose in a string)."""
    end = start
    for _ in range(_MAX_LINES):
        newline = source.find(b"\n", end)
        end = len(source) if newline < 0 else newline + 1
        try:
            body = ast.parse(source[start:end]).body
        except SyntaxError:
            if newline < 0:
                return None
            continue
        return body[0] if body else None
    return None


_MAX_LINES = 200  # an import statement longer than this would be a list of 200 names
