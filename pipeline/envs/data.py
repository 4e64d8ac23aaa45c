"""The built-in environments' data files: the project's `specs/` folder, the pins of the official
simulators, and the fingerprint of data files that goes into an environment's version."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

# Package data, so a wheel installed anywhere has it: the repository keeps specs/ at its top and
# pipeline/specs links to it; the wheel carries the files themselves (pyproject.toml, package-data).
BUILTIN_SPECS = Path(str(resources.files("pipeline") / "specs")).resolve()


def files_fingerprint(*paths: Path) -> str:
    """A short hash of the files' bytes, in order: part of an environment's version, so that editing its
    data files makes earlier scored shards stale."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def simulator_pins(wheels: bool = False) -> dict[str, str]:
    """Package -> pinned version of the official simulators: `specs/simulators.txt` (installed), or with
    `wheels` `specs/simulator-wheels.txt` (releases read from their wheel). The Makefile installs from them."""
    path = BUILTIN_SPECS / ("simulator-wheels.txt" if wheels else "simulators.txt")
    pins = {}
    for line in path.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            package, _, pinned = requirement.partition("==")
            pins[package.strip()] = pinned.strip()
    return pins
