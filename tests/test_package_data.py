"""What the wheel carries: setuptools' own `build_py` (the step that fills a wheel) over a copy of the project
with editor backups beside the specs; none of them may be packaged."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_editor_backups_stay_out_of_the_wheel(tmp_path: Path) -> None:
    copy = tmp_path / "project"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "specs", copy / "specs")
    shutil.copytree(ROOT / "pipeline", copy / "pipeline", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    backups = ["support/spec.toml~", "support/tools.json.swp", "support/spec.toml.orig", "shop/spec.toml.bak"]
    for backup in backups:
        (copy / "specs" / backup).write_text("stale")
    build = [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "--build-lib", "out"]
    subprocess.run(build, cwd=copy, check=True, capture_output=True, timeout=300)
    packaged = {p.relative_to(copy / "out").as_posix() for p in (copy / "out").rglob("*") if p.is_file()}
    assert "pipeline/specs/support/spec.toml" in packaged  # the specs themselves are there
    assert not {f"pipeline/specs/{b}" for b in backups} & packaged
