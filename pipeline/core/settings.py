"""How a stage's settings object checks its values (pipeline/scoring/settings.py, pipeline/metrics/settings.py).

A settings object is made from a command's options or from a job file's table, and checks its own values when it
is made, whatever made it: a job file's values are TOML (a string where a number belongs reaches the object as
is), so each check covers the value's type as well as its range. A value that does not fit raises SettingError,
whose message starts with the setting's key: a job file's key has that name, and the command line's option is the
key with dashes (`shard_mb` is `--shard-mb`), so each surface names the setting as its user wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.core.errors import SettingError


def is_whole(value: object) -> bool:
    """An int, not a bool: a setting's declared type is checked at run time, since job files and callers can put
    anything there."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (TOML and JSON booleans are ints to Python)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# Each check raises `error` (SettingError or a subclass of it: a stage's own) naming `key` when `value` does not fit.


def check_flag(key: str, value: Any, error: type[SettingError] = SettingError) -> None:
    if not isinstance(value, bool):
        raise error(key, f"{key} is true or false, got {value!r}")


def check_whole(
    key: str, value: Any, low: int, high: int | None = None, error: type[SettingError] = SettingError
) -> None:
    """`value` is an int in [low, high] (no upper bound when `high` is None)."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high):
        return
    bounds = f"{low:,} to {high:,}" if high is not None else f">= {low:,}"
    raise error(key, f"{key} is a whole number {bounds}, got {value!r}")


def check_number(key: str, value: Any, low: float, high: float, error: type[SettingError] = SettingError) -> None:
    """`value` is a number (int or float) in [low, high]."""
    if not is_number(value) or not low <= value <= high:
        raise error(key, f"{key} is a number {low:g} to {high:g}, got {value!r}")


def check_name(key: str, value: Any, optional: bool = True, error: type[SettingError] = SettingError) -> None:
    """`value` is a non-empty string (or None when `optional`)."""
    if (value is None and optional) or (isinstance(value, str) and value):
        return
    raise error(key, f"{key} is a non-empty string, got {value!r}")


def check_names(key: str, value: Any, error: type[SettingError] = SettingError) -> None:
    """`value` is a sequence of non-empty strings (a list or tuple, not a string)."""
    if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, str) and v for v in value):
        return
    raise error(key, f"{key} is a list of names, got {value!r}")


def check_one_of(key: str, value: Any, choices: Sequence[str], error: type[SettingError] = SettingError) -> None:
    if not isinstance(value, str) or value not in choices:
        raise error(key, f"{key} is {' or '.join(choices)}, got {value!r}")
