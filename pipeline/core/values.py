"""Whether a replayed tool output equals the logged one, as values (docs/explanation/data-model.md, "The run folder":
`output_match`).

Logs write outputs as text in several dialects: JSON, or the Python repr ToolSandbox writes (single-quoted
dicts and lists, `None`/`True`/`False`, tuples). Text is read back as JSON, else as a Python literal with
`ast.literal_eval` (literals only, never evaluated as code), else compared as stripped text. Numbers are equal
within a relative or absolute tolerance of 1e-9 (the same float computed on another platform or library
version differs in the last digits); containers compare element by element (a tuple read as a list).
"""

from __future__ import annotations

import ast
import math
from typing import Any

import orjson

# orjson refuses these instead of writing them as the standard library would (or would not: dates, dataclasses).
_EXACT_TYPES = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
REL_TOL = 1e-9
ABS_TOL = 1e-9
ATOMS = frozenset({str, int, float, bool, type(None)})  # the types of JSON's atoms: immutable, never copied
_LITERAL_START = (*"[{('\"-0123456789", "None", "True", "False")
_JSON_SPACE = " \t\n\r"  # the whitespace JSON (and orjson) allows before a value
_JSON_START = frozenset('{["-0123456789tfn')  # the first character of every JSON value


def same(replayed: Any, logged: Any) -> bool:
    """Whether two outputs (values or their text) are the same value."""
    a, b = decoded(replayed), decoded(logged)
    return _identical(a, b) or _equal(a, b)


def _identical(a: Any, b: Any) -> bool:
    """Equal as Python values and as JSON text, which implies `_equal` (the common case of a replay, decided in
    C): Python alone takes True for 1, JSON text alone takes NaN for None (both `null`)."""
    try:
        return bool(a == b) and orjson.dumps(a) == orjson.dumps(b)
    except (TypeError, ValueError, RecursionError):  # orjson.JSONEncodeError is a TypeError; no JSON form
        return False


class NotExact(ValueError):
    """orjson cannot stand in for the standard library's JSON round trip of this value."""


def json_copy(value: Any) -> Any:
    """`value` read back from its JSON text, decided in C (orjson) for the common case of plain JSON data.
    NotExact when the standard library's round trip might give something else, so that the caller runs its
    own: orjson refuses subclasses, dates, dataclasses, ints past 64 bits and invalid text, and writes NaN,
    infinities, enums and tuples differently, which the comparison with `value` catches."""
    try:
        fast = orjson.loads(orjson.dumps(value, option=_EXACT_TYPES))
        if fast == value:
            return fast
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise NotExact(str(exc)) from exc
    raise NotExact("orjson writes this value differently")


def decoded(value: Any) -> Any:
    """A logged output as a value: text is read as JSON, else as a Python literal, else kept as stripped text."""
    if not isinstance(value, str):
        return value
    if value.lstrip(_JSON_SPACE)[:1] in _JSON_START:  # else orjson refuses it: plain text skips raising
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
    text = value.strip()
    if text.startswith(_LITERAL_START):
        try:
            return _plain(ast.literal_eval(text))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return text


def _plain(value: Any) -> Any:
    """A Python literal as a JSON value (a tuple as a list); ValueError for what JSON has no value for (sets,
    bytes, complex numbers, non-text keys)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    raise ValueError(f"no JSON value for {type(value).__name__}")


def _equal(a: Any, b: Any) -> bool:
    kind = type(a)
    if kind is type(b):  # the common case, decided without the isinstance tests below
        if kind is dict:
            return a.keys() == b.keys() and all(map(_equal, a.values(), map(b.__getitem__, a)))
        if kind is list:
            return len(a) == len(b) and all(map(_equal, a, b))
        if kind is str or kind is bool or a is None:
            return bool(a == b)
    if _number(a) and _number(b):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):  # True is not 1
        return a is b
    return bool(a == b)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
