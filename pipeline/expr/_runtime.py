"""What a compiled expression runs on, in either of its forms (the closures of _compiler.py, the translated
function of _fast.py): the whitelisted functions, the operators, the names `true`/`false`/`null`, type
names for error messages, RE2's options, and what evaluation charges to the budget (scans done in C,
values built, steps per comprehension item).

Its names keep their leading underscore although the package's other modules import them: they belong to
the package, not to the language's public surface (`pipeline.expr`)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Collection, Mapping
from types import UnionType
from typing import Any

import re2

from pipeline.expr._budget import BUDGET, BudgetExceeded, EvalError, _meter

# One compiled form of an expression (its closures, or its fast function): context -> value.
Fn = Callable[[Mapping[str, Any]], Any]


_TYPE_NAMES: dict[type, str] = {dict: "object", list: "list", tuple: "list"}  # else the Python type's name


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _lookup_error(obj: Any, key: Any, node: ast.AST) -> EvalError:
    where = ast.unparse(node)
    if isinstance(obj, Mapping):
        return EvalError(f"no key {key!r} in {where}")
    if isinstance(obj, list | tuple | str) and isinstance(key, int):
        return EvalError(f"index {key} out of range for {where} (length {len(obj)})")
    return EvalError(f"cannot look up {key!r} in {where}: it is {_type_name(obj)}")


def _iterable(value: Any, node: ast.AST) -> Collection[Any]:
    if isinstance(value, list | tuple | str | Mapping):
        return value
    raise EvalError(f"cannot iterate over {ast.unparse(node)}: it is {_type_name(value)}")


# ---- whitelisted functions; they raise TypeError/ValueError, which calls turn into EvalError ----


def _expect(value: Any, kind: type | UnionType, what: str) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {what}, got {_type_name(value)}")
    return value


def _get(container: Any, key: Any, default: Any = None) -> Any:
    if container is None:
        return default
    if isinstance(container, Mapping):
        return container.get(key, default)
    _expect(container, list | tuple, "an object or a list")
    if type(key) is int and -len(container) <= key < len(container):
        return container[key]
    return default


def _has(container: Any, key: Any) -> bool:
    if container is None:
        return False
    if isinstance(container, Mapping):
        return key in container
    _expect(container, list | tuple, "an object or a list")
    return type(key) is int and -len(container) <= key < len(container)


def _unique(items: Any) -> list[Any]:
    out: list[Any] = []
    seen: set[Any] = set()
    for item in _list(items):
        try:
            if item in seen:
                continue
            seen.add(item)
        except TypeError:  # unhashable (object or list): fall back to equality
            _meter().step(len(out))  # quadratic: every comparison is a step
            if item in out:
                continue
        out.append(item)
    return out


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, str | list) and isinstance(b, str | list):
        _meter().build(len(a) + len(b))
    return a + b


def _mul(a: Any, b: Any) -> Any:
    # Numbers only: sequence repetition ('x' * 10**9) could exhaust memory.
    if isinstance(a, int | float) and isinstance(b, int | float):
        if type(a) is int and type(b) is int and a.bit_length() + b.bit_length() > BUDGET.int_bits:
            raise BudgetExceeded(f"evaluation budget exceeded: a product of more than {BUDGET.int_bits} bits")
        return a * b
    raise TypeError(f"'*' needs numbers, got {_type_name(a)} and {_type_name(b)}")


def _sum(items: Any, start: Any = 0) -> Any:
    # Numbers only: summing lists would build a quadratic amount of copies.
    if isinstance(start, bool) or not isinstance(start, int | float):
        raise TypeError(f"the start must be a number, got {_type_name(start)}")
    return sum(items, start)


def _mod(a: Any, b: Any) -> Any:
    # Numbers only: str % formatting ('%*d') could exhaust memory.
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a % b
    raise TypeError(f"'%' needs numbers, got {_type_name(a)} and {_type_name(b)}")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {_type_name(value)}")


def _list(value: Any) -> list[Any] | tuple[Any, ...]:
    if isinstance(value, list | tuple):
        return value
    raise TypeError(f"expected a list, got {_type_name(value)}")


_FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None, tuple[str, ...]]] = {
    # name: (function, min positional args, max positional args or None, keyword names)
    "len": (len, 1, 1, ()),
    "str": (str, 1, 1, ()),
    "int": (int, 1, 1, ()),
    "float": (float, 1, 1, ()),
    "bool": (bool, 1, 1, ()),
    "abs": (abs, 1, 1, ()),
    "min": (min, 1, None, ()),
    "max": (max, 1, None, ()),
    "sum": (_sum, 1, 2, ()),
    "round": (round, 1, 2, ()),
    "any": (any, 1, 1, ()),
    "all": (all, 1, 1, ()),
    "sorted": (sorted, 1, 1, ("reverse",)),
    "keys": (lambda d: list(_expect(d, Mapping, "an object")), 1, 1, ()),
    "values": (lambda d: list(_expect(d, Mapping, "an object").values()), 1, 1, ()),
    "items": (lambda d: [[k, v] for k, v in _expect(d, Mapping, "an object").items()], 1, 1, ()),
    "get": (_get, 2, 3, ("default",)),
    "has": (_has, 2, 2, ()),
    "lower": (lambda s: _text(s).lower(), 1, 1, ()),
    "upper": (lambda s: _text(s).upper(), 1, 1, ()),
    "startswith": (lambda s, prefix: _text(s).startswith(_text(prefix)), 2, 2, ()),
    "endswith": (lambda s, suffix: _text(s).endswith(_text(suffix)), 2, 2, ()),
    "contains": (lambda container, x: x in container, 2, 2, ()),
    "concat": (lambda a, b: [*_list(a), *_list(b)], 2, 2, ()),
    "unique": (_unique, 1, 1, ()),
    "count": (lambda items, x: _list(items).count(x), 2, 2, ()),
    "matches": (lambda s, pattern: pattern.fullmatch(_text(s)) is not None, 2, 2, ()),
}
# RE2 runs in time linear in the text (no backtracking: '(a+)+$' cannot explode); errors are raised, not logged.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
# Functions that do not walk their arguments (a length, one lookup, a prefix): no scan to charge.
_CONSTANT_TIME = frozenset({"len", "get", "has", "startswith", "endswith", "bool", "int", "float", "abs", "round"})
# These consume a generator-expression argument lazily, so any()/all() short-circuit as in Python.
_LAZY_CONSUMERS = frozenset({"any", "all", "sum", "min", "max", "sorted"})
_CALL_ERRORS = (TypeError, ValueError, ArithmeticError)

_BINOPS: dict[type[ast.operator], tuple[str, Callable[[Any, Any], Any]]] = {
    ast.Add: ("+", _add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", _mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", _mod),
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: _scanned(b) and a in b,
    ast.NotIn: lambda a, b: not (_scanned(b) and a in b),
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_ALIASES = {"true": True, "false": False, "null": None}


def _scanned(value: Any) -> bool:
    """Charge a scan of `value` done in C (membership, a function over a list), which one node does not
    cover: a step per element of a long list, per 64 characters of a long string. Always true. Objects are
    not charged: lookups in them take constant time, and what lists their contents is charged as built."""
    kind = type(value)
    if kind is list or kind is tuple:
        n = len(value)
    elif kind is str:
        n = len(value) >> 6
    else:
        return True
    if n > 64:
        _meter().step(n)
    return True


def _charged(result: Any) -> Any:
    """A function's result, its size charged to the budget (sorted, concat, str, keys, ... build new values).

    The call itself costs no step: outside comprehensions calls are bounded by the expression's size, inside
    them every node is charged per item."""
    if isinstance(result, str | list | dict):
        _meter().build(len(result))
    return result


def _size(node: ast.AST) -> int:
    return sum(1 for _ in ast.walk(node))


def _loop_cost(
    node: ast.ListComp | ast.GeneratorExp | ast.DictComp, gen: ast.comprehension, body: list[ast.expr]
) -> int:
    """Steps charged per item of one comprehension clause: the item itself, its conditions, and the element
    (`body`) on the innermost clause."""
    return 1 + sum(_size(c) for c in gen.ifs) + (sum(map(_size, body)) if gen is node.generators[-1] else 0)
