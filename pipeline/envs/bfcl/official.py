"""Access to the pinned `bfcl-eval` package: simulator classes, function docs and the multi-turn datasets.

The package is imported lazily (only here, and only when called), so the rest of pexec imports without it.
Datasets come either from the installed package or from another release's wheel (the `BFCL_v3_*` names
ship only up to 2025.8.6.2): a folder or a `.whl` file given by the caller or by $PEXEC_BFCL_DATA, else
the wheels under `<venv>/bfcl-data/` that the Makefile downloads.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import zipfile
from functools import cache
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pipeline.envs.base import EnvError

PACKAGE = "bfcl-eval"
DATA_ENV = "PEXEC_BFCL_DATA"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
_SOURCE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# class -> (module in func_source_code, function doc file): the eight multi-turn simulators.
CLASSES: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
STATELESS = frozenset({"MathAPI"})


def package_version() -> str:
    try:
        return version(PACKAGE)
    except PackageNotFoundError as exc:
        raise EnvError(f"{PACKAGE} is not installed (make installs it pinned, without its dependencies)") from exc


@cache
def simulator_class(name: str) -> type:
    module, _ = CLASSES[name]
    try:
        return getattr(import_module(f"{_SOURCE}.{module}"), name)
    except ImportError as exc:
        raise EnvError(f"cannot import the BFCL simulator {name}: {exc}") from exc


@cache
def _installed_data() -> Path:
    package_version()
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data"


@cache
def function_docs() -> dict[str, list[dict[str, Any]]]:
    """Class -> its function docs (BFCL's own JSON Lines files), from the installed package."""
    data = _installed_data() / "multi_turn_func_doc"
    return {cls: _json_lines((data / doc).read_text(), str(data / doc)) for cls, (_, doc) in CLASSES.items()}


def data_file_name(version_tag: str, category: str, answers: bool = False) -> str:
    """Path inside a release's `data/` folder: `BFCL_v3_multi_turn_base.json`, `possible_answer/...`."""
    name = f"BFCL_{version_tag}_multi_turn_{category}.json"
    return f"possible_answer/{name}" if answers else name


def read_data_file(relative: str, source: str | None = None) -> list[dict[str, Any]]:
    """A dataset file (path relative to `data/`) from `source`, $PEXEC_BFCL_DATA, the installed package, or
    the wheels in `<venv>/bfcl-data/`, the first that has it."""
    candidates = [source] if source else []
    if os.environ.get(DATA_ENV):
        candidates.append(os.environ[DATA_ENV])
    if not source:
        with contextlib.suppress(EnvError):  # not installed: the wheels below may still have the file
            candidates.append(str(_installed_data()))
        candidates += sorted(str(p) for p in (Path(sys.prefix) / "bfcl-data").glob("bfcl_eval-*.whl"))
    for candidate in candidates:
        text = _read_from(Path(candidate), relative)
        if text is not None:
            return _json_lines(text, f"{candidate}:{relative}")
    searched = ", ".join(candidates) or "nothing"
    raise EnvError(f"BFCL dataset file {relative} not found (searched {searched}); pass --option dataset=PATH")


def _read_from(path: Path, relative: str) -> str | None:
    if path.is_file() and path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            try:
                return wheel.read(f"bfcl_eval/data/{relative}").decode()
            except KeyError:
                return None
    for base in (path, path / "data", path / "bfcl_eval" / "data"):
        if (base / relative).is_file():
            return (base / relative).read_text()
    return None


def _json_lines(text: str, where: str) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise EnvError(f"{where}: not JSON Lines: {exc}") from exc
