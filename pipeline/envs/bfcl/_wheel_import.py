"""Import a bfcl-eval release's simulator modules straight from its wheel, beside the installed release.

Two releases cannot be installed at once (both are the package `bfcl_eval`), yet `bfcl_v3` must replay
against 2025.8.6.2 while `bfcl_v4` uses the installed release. So the older release's simulator modules are
loaded from its wheel file under a private package name (`_pexec_bfcl_2025_8_6_2.gorilla_file_system`, …)
by the standard import machinery (a `SourceLoader` reading the zip member; nothing is unpacked). Their
absolute imports of sibling modules (`from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.long_context
import …`) are pointed at the same release's sibling while a module loads; the installed modules are put
back afterwards, so the two releases never see each other's code.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import re
import sys
import threading
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import WheelImportError

SOURCE_DIR = "bfcl_eval/eval_checker/multi_turn_eval/func_source_code"
INSTALLED_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
_LOCK = threading.Lock()  # sys.modules is swapped while a release module loads


class _WheelSource(importlib.abc.SourceLoader):
    def __init__(self, wheel: Path, member: str) -> None:
        self.wheel = wheel
        self.member = member

    def get_filename(self, fullname: str) -> str:
        return f"{self.wheel}/{self.member}"

    def get_data(self, path: str) -> bytes:
        with zipfile.ZipFile(self.wheel) as archive:
            return archive.read(self.member)


def private_package(version: str) -> str:
    return "_pexec_bfcl_" + re.sub(r"\W", "_", version)


def load_modules(wheel: Path, version: str, names: list[str]) -> dict[str, types.ModuleType]:
    """The modules `names` of the wheel's `func_source_code`, loaded in the order given (a module's siblings
    before it) under the release's private package; loaded once per process."""
    package = private_package(version)
    with _LOCK:
        if package not in sys.modules:
            parent = types.ModuleType(package, f"bfcl-eval {version} simulators, loaded from {wheel.name}")
            parent.__path__ = []  # a package with nothing to find on disk: members are added below
            sys.modules[package] = parent
        loaded: dict[str, types.ModuleType] = {}
        for name in names:
            full = f"{package}.{name}"
            if full not in sys.modules:
                sys.modules[full] = _load(wheel, name, full, loaded)
            loaded[name] = sys.modules[full]
        return loaded


def _load(wheel: Path, name: str, full: str, siblings: dict[str, types.ModuleType]) -> types.ModuleType:
    loader = _WheelSource(wheel, f"{SOURCE_DIR}/{name}.py")
    spec = importlib.util.spec_from_loader(full, loader)
    if spec is None:
        raise WheelImportError(f"{wheel}: cannot make an import spec for {name}")
    module = importlib.util.module_from_spec(spec)
    try:
        with _as_installed(siblings):
            loader.exec_module(module)
    except (KeyError, OSError, zipfile.BadZipFile) as exc:
        raise WheelImportError(f"{wheel}: cannot read {loader.member}: {exc}") from exc
    except ImportError as exc:
        raise WheelImportError(f"{wheel}: {name} does not import: {exc}") from exc
    return module


@contextlib.contextmanager
def _as_installed(siblings: dict[str, types.ModuleType]) -> Iterator[None]:
    """Make `from bfcl_eval…func_source_code.<sibling> import …` find this release's sibling."""
    saved = {}
    for name, module in siblings.items():
        key = f"{INSTALLED_PACKAGE}.{name}"
        saved[key] = sys.modules.get(key)
        sys.modules[key] = module
    try:
        yield
    finally:
        for key, previous in saved.items():
            if previous is None:
                del sys.modules[key]
            else:
                sys.modules[key] = previous
