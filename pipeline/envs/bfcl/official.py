"""The pinned `bfcl-eval` releases: simulator classes, function docs and the multi-turn datasets.

Each environment replays against the release its data naming comes from. `bfcl_v4` uses the installed
package (pinned by the Makefile). `bfcl_v3` uses 2025.8.6.2, the last release with `BFCL_v3_*` data: its
simulators differ from later ones (`TradingBot.update_market_status` exists, `echo` into a missing file
creates it, `cd` accepts nested paths, …), so v3 runs replay only against it. That release cannot be
installed beside the other; it is read from its wheel (`wheel_import`), found in $PEXEC_BFCL_DATA (a wheel
or a folder of wheels) or `<venv>/bfcl-data/`, where the Makefile downloads it.

`bfcl_eval` is imported lazily (only here, and only when called), so the rest of pexec imports without it.
Datasets come from the release that replays their naming (or from a folder or wheel the caller names).
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pipeline.core.errors import EnvError, WheelImportError
from pipeline.envs.bfcl import _wheel_import as wheel_import
from pipeline.envs.data import simulator_pins

PACKAGE = "bfcl-eval"
DATA_ENV = "PEXEC_BFCL_DATA"
V3_RELEASE = simulator_pins(wheels=True)[PACKAGE]  # 2025.8.6.2, the last release with BFCL_v3 data
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
_DOCS = "bfcl_eval/data/multi_turn_func_doc"
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
_SHARED_MODULES = ["long_context"]  # imported by several simulator modules: loaded before them


@dataclass(frozen=True)
class Release:
    """One bfcl-eval release: the installed package (`wheel` None) or a wheel file read in place."""

    version: str
    wheel: Path | None = None

    @property
    def pin(self) -> str:
        return f"{PACKAGE}=={self.version}"

    def simulator_class(self, name: str) -> type:
        cls: type = getattr(self._modules[CLASSES[name][0]], name)
        return cls

    @cached_property
    def function_docs(self) -> dict[str, list[dict[str, Any]]]:
        """Class -> its function docs (BFCL's own JSON Lines files)."""
        docs = {}
        for cls, (_, doc) in CLASSES.items():
            where = f"{self.wheel or _installed_root()}:{_DOCS}/{doc}"
            docs[cls] = _json_lines(self.read(f"{_DOCS}/{doc}"), where)
        return docs

    @cached_property
    def _modules(self) -> dict[str, Any]:
        names = _SHARED_MODULES + [module for module, _ in CLASSES.values()]
        if self.wheel is None:
            try:
                return {n: import_module(f"{wheel_import.INSTALLED_PACKAGE}.{n}") for n in names}
            except ImportError as exc:
                raise EnvError(f"cannot import the BFCL simulators of {self.pin}: {exc}") from exc
        try:
            return wheel_import.load_modules(self.wheel, self.version, names)
        except WheelImportError as exc:
            raise EnvError(f"cannot load the BFCL simulators of {self.pin}: {exc}") from exc

    def read(self, member: str) -> str:
        """A file of the release by its path in the wheel (`bfcl_eval/data/...`)."""
        if self.wheel is None:
            try:
                return (_installed_root().parent / member).read_text()
            except OSError as exc:
                raise EnvError(f"{self.pin}: cannot read {member}: {exc}") from exc
        try:
            with zipfile.ZipFile(self.wheel) as archive:
                return archive.read(member).decode()
        except (KeyError, OSError, zipfile.BadZipFile) as exc:
            raise EnvError(f"{self.wheel}: cannot read {member}: {exc}") from exc


@cache
def release(tag: str) -> Release:
    """The release that replays data of naming `tag` ("v3", "v4")."""
    if tag == "v3":
        return Release(V3_RELEASE, find_wheel(V3_RELEASE))
    return Release(installed_version())


def installed_version() -> str:
    try:
        return version(PACKAGE)
    except PackageNotFoundError as exc:
        raise EnvError(f"{PACKAGE} is not installed (make installs it pinned, without its dependencies)") from exc


def find_wheel(release_version: str) -> Path:
    pattern = f"bfcl_eval-{release_version}-*.whl"
    places = _wheel_places()
    for place in places:
        if place.is_file() and place.match(pattern):
            return place
        if place.is_dir():
            found = sorted(place.glob(pattern))
            if found:
                return found[0]
    raise EnvError(
        f"{PACKAGE} {release_version} (the simulators of BFCL_v3 data) not found as {pattern} in "
        f"{', '.join(map(str, places))}: `make install` downloads it, or run `pip download --no-deps "
        f"{PACKAGE}=={release_version} -d DIR` and set ${DATA_ENV}=DIR"
    )


def _wheel_places() -> list[Path]:
    places = [Path(os.environ[DATA_ENV])] if os.environ.get(DATA_ENV) else []
    return [*places, Path(sys.prefix) / "bfcl-data"]


@cache
def _installed_root() -> Path:
    installed_version()
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent


def data_file_name(version_tag: str, category: str, answers: bool = False) -> str:
    """Path inside a release's `data/` folder: `BFCL_v3_multi_turn_base.json`, `possible_answer/...`."""
    name = f"BFCL_{version_tag}_multi_turn_{category}.json"
    return f"possible_answer/{name}" if answers else name


def read_dataset(tag: str, category: str, answers: bool = False, source: str | None = None) -> list[dict[str, Any]]:
    """The tasks (or, with `answers`, the ground truth) of one category of a data naming, from the release
    that replays that naming (so data and simulators always match), or from `source` (a folder or a wheel)."""
    relative = data_file_name(tag, category, answers)
    if source is None:
        return _json_lines(release(tag).read(f"bfcl_eval/data/{relative}"), f"{release(tag).pin}: {relative}")
    text = _read_from(Path(source), relative)
    if text is None:
        raise EnvError(f"BFCL dataset file {relative} not found in {source}")
    return _json_lines(text, f"{source}:{relative}")


def _read_from(path: Path, relative: str) -> str | None:
    if path.is_file() and path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            try:
                return wheel.read(f"bfcl_eval/data/{relative}").decode()
            except KeyError:
                return None
    for base in (path, path / "data", path / "bfcl_eval" / "data", *sorted(path.glob("bfcl_eval-*.whl"))):
        if base.suffix == ".whl":
            text = _read_from(base, relative)
            if text is not None:
                return text
        elif (base / relative).is_file():
            return (base / relative).read_text()
    return None


def _json_lines(text: str, where: str) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise EnvError(f"{where}: not JSON Lines: {exc}") from exc
