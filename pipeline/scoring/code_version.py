"""The code version of scoring: what decides whether an earlier run's scored shards can be reused.

It is the package version plus a hash of the source that scoring executes: `scoring/shard.py`, all of `envs/`
(scoring resolves environments by name, so any family may run, with the rule engine and the spec family),
and every package module these import, followed through their `import` statements (lazy ones inside
functions included). Editing the report, the DuckDB stage, ingest or the CLI therefore keeps scored
shards reusable; editing the checker or an environment rescores them.
Environments' data files (specs, pins) are covered by each environment's own version.
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from importlib.metadata import version
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # pipeline/
_NAME = PACKAGE_ROOT.name


@cache
def code_version() -> str:
    digest = hashlib.sha256()
    for path in sorted(scoring_sources()):
        digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return f"{version('pexec')}+{digest.hexdigest()[:12]}"


def scoring_sources() -> set[Path]:
    """The package's source files that scoring can execute."""
    pending = [PACKAGE_ROOT / "scoring" / "shard.py", *(PACKAGE_ROOT / "envs").rglob("*.py")]
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path not in seen:
            seen.add(path)
            pending += _imported_files(path)
    return seen


def _imported_files(path: Path) -> list[Path]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pipeline.envs import bfcl` may name a module or a member: try both
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    files = []
    for name in names:
        parts = name.split(".")
        if parts[0] == _NAME and len(parts) > 1:
            base = PACKAGE_ROOT.joinpath(*parts[1:])
            files += [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()]
    return files
