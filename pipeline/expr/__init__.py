"""A safe, non-Turing-complete expression language for environment specs.

Expressions use a subset of Python expression syntax over JSON values. Source is parsed with
`ast.parse(mode="eval")`, checked against a whitelist of node types and compiled into nested closures
(`f(ctx) -> value`); the checked tree is also translated into a syntax tree of our own, compiled into a
function without builtins that runs first (`_Translator`, `Expr`). Nothing is ever passed to eval/exec.
Comprehensions only iterate finite data and there is no recursion, loop or `**`, so evaluation always
terminates — and it terminates soon: an expression is limited in size and loop nesting when it is compiled,
and every evaluation runs under a `Budget` (steps, characters and elements built, integer size, wall-clock
time as a backstop). Going over it raises `BudgetExceeded`, which rules report as a failed precondition.
Regular expressions run on RE2 (linear time).

Imports: core.
"""

from __future__ import annotations

import ast
import operator
import threading
import time
import types
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import re2

from pipeline.core.errors import PexecError

__all__ = [
    "BUDGET",
    "Budget",
    "BudgetExceeded",
    "EvalError",
    "Expr",
    "ExprError",
    "Target",
    "compile_expr",
    "compile_target",
    "metered",
    "render",
]

Fn = Callable[[Mapping[str, Any]], Any]


class ExprError(PexecError, ValueError):
    """A bad expression, raised at compile time."""

    def __init__(self, source: str, problem: str, column: int | None = None) -> None:
        where = f" (column {column})" if column is not None else ""
        super().__init__(f"{problem}{where} in expression: {source}")
        self.source, self.problem, self.column = source, problem, column

    def __reduce__(self) -> tuple[Any, ...]:  # keeps it picklable (Ray ships exceptions between processes)
        return type(self), (self.source, self.problem, self.column)


class EvalError(Exception):
    """An expression failed at evaluation time (missing key, type error, division by zero, ...)."""


class BudgetExceeded(EvalError):
    """An evaluation went over its budget. Unlike other evaluation errors it says something about the
    expression, not about missing data, so rules never skip it: it fails the call."""


@dataclass(frozen=True)
class Budget:
    """What one evaluation (or one `metered()` block, e.g. a whole tool call) may spend."""

    steps: int = 1_000_000  # syntax nodes evaluated per comprehension item, plus scans done in C
    size: int = 10_000_000  # characters and elements built (concatenations, slices, function results)
    int_bits: int = 4096  # the largest integer a product may make
    seconds: float = 10.0  # backstop only: the deterministic limits above stop any evaluation within ~1 s idle


BUDGET = Budget()
MAX_NODES = 2000  # syntax nodes of one expression
MAX_LOOPS = 3  # comprehension clauses nested in one another
_CLOCK_EVERY = 10_000  # steps between two looks at the clock


class _Meter:
    __slots__ = ("budget", "clock", "deadline", "size", "steps")

    def __init__(self, budget: Budget) -> None:
        self.budget, self.steps, self.size = budget, budget.steps, budget.size
        self.deadline, self.clock = time.monotonic() + budget.seconds, _CLOCK_EVERY

    def step(self, n: int) -> None:
        self.steps -= n
        if self.steps < 0:
            raise BudgetExceeded(f"evaluation budget exceeded: more than {self.budget.steps:,} steps")
        self.clock -= n
        if self.clock <= 0:
            self.clock = _CLOCK_EVERY
            if time.monotonic() > self.deadline:
                raise BudgetExceeded(f"evaluation budget exceeded: more than {self.budget.seconds:g} s")

    def build(self, n: int) -> None:
        self.size -= n
        if self.size < 0:
            raise BudgetExceeded(
                f"evaluation budget exceeded: builds more than {self.budget.size:,} characters or elements"
            )


class _Active(threading.local):
    # None outside any evaluation; _PENDING inside one that has not charged anything yet (most rules never
    # do, and they should not pay for a meter)
    meter: _Meter | object | None = None


_active = _Active()
_PENDING = object()


def _meter() -> _Meter:
    meter = _active.meter
    if type(meter) is _Meter:
        return meter
    if meter is None:  # closures only run inside Expr.__call__
        raise RuntimeError("expression closure evaluated outside Expr.__call__")
    meter = _active.meter = _Meter(BUDGET)
    return meter


class metered:  # lower case: used like a function, `with metered():`
    """Every expression evaluated inside the block shares one budget (e.g. all rules of one tool call).

    A class rather than a generator: it runs around every simulated call."""

    __slots__ = ("outermost",)

    def __enter__(self) -> None:
        self.outermost = _active.meter is None
        if self.outermost:
            _active.meter = _PENDING

    def __exit__(self, *exc: object) -> None:
        if self.outermost:
            _active.meter = None


class Expr:
    """A compiled expression; call it with a mapping of names to values.

    Two forms of the same expression: nested closures (`_fn`), whose errors say what went wrong and where,
    and, where the expression allows, a function compiled from its validated syntax tree (`_fast`, see
    `_Translator`) that charges the same budget. The fast form runs first; if it raises anything, the
    budget is put back as it was and the closures run instead, so every result and every error is theirs."""

    __slots__ = ("_fast", "_fn", "_template", "names", "source")

    def __init__(
        self, source: str, names: frozenset[str], fn: Fn, template: bool = False, fast: Fn | None = None
    ) -> None:
        self.source, self.names, self._fn, self._template, self._fast = source, names, fn, template, fast

    def __call__(self, ctx: Mapping[str, Any]) -> Any:
        meter = _active.meter
        if meter is None:
            meter = _active.meter = _PENDING
            outermost = True
        else:
            outermost = False
        try:
            if self._fast is not None:
                spent = (meter.steps, meter.size, meter.clock) if type(meter) is _Meter else None
                try:
                    return self._fast(ctx)
                except Exception:  # the closures decide what this is, from the same budget (and deadline)
                    now = _active.meter
                    if type(now) is _Meter:
                        now.steps, now.size, now.clock = spent or (now.budget.steps, now.budget.size, _CLOCK_EVERY)
            return self._fn(ctx)
        except RecursionError:
            raise EvalError(f"expression too deeply nested: {self.source}") from None
        except BudgetExceeded as exc:
            if "evaluating: " in str(exc):  # an inner expression (a placeholder) already said which
                raise
            raise BudgetExceeded(f"{exc} evaluating: {self.source}") from None
        finally:
            if outermost:
                _active.meter = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Closures do not pickle; recompile from source (its free names suffice) on the other side.
        return (render if self._template else compile_expr), (self.source, self.names)

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "list", tuple: "list"}.get(type(value), type(value).__name__)


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


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
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
    return _expect(value, str, "a string")


def _list(value: Any) -> list[Any] | tuple[Any, ...]:
    return _expect(value, list | tuple, "a list")


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
# These consume a generator-expression argument lazily, so any()/all() short-circuit as in Python.
# RE2 runs in time linear in the text (no backtracking: '(a+)+$' cannot explode); errors are raised, not logged.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
# Functions that do not walk their arguments (a length, one lookup, a prefix): no scan to charge.
_CONSTANT_TIME = frozenset({"len", "get", "has", "startswith", "endswith", "bool", "int", "float", "abs", "round"})
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
_FORBIDDEN = {
    ast.Lambda: "lambda",
    ast.NamedExpr: "':=' (walrus)",
    ast.JoinedStr: "f-strings",
    ast.Set: "set literals",
    ast.SetComp: "set comprehensions",
    ast.Starred: "starred expressions",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Await: "await",
}


def _is_dunder(name: str) -> bool:
    return name.startswith("__")


class _Compiler:
    """Turns one parsed expression into closures; records the free names it reads."""

    def __init__(self, source: str, names: Iterable[str]) -> None:
        if isinstance(names, str):
            raise TypeError("names must be an iterable of names, not a single string")
        self.source = source
        self.allowed = frozenset(names)
        self.free: set[str] = set()
        self.loops = 0  # comprehension clauses around the node being compiled

    def error(self, node: ast.AST | None, problem: str) -> ExprError:
        offset, lineno = getattr(node, "col_offset", None), getattr(node, "lineno", 1)
        if offset is None:
            return ExprError(self.source, problem)
        # col_offset counts UTF-8 bytes; report characters.
        line = self.source.splitlines()[lineno - 1] if lineno > 1 else self.source
        return ExprError(self.source, problem, len(line.encode()[:offset].decode(errors="ignore")) + 1)

    def compile(self, node: ast.AST, local: frozenset[str] = frozenset()) -> Fn:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            what = _FORBIDDEN.get(type(node), f"{type(node).__name__} expressions")
            raise self.error(node, f"{what} not allowed")
        return method(node, local)

    def _Constant(self, node: ast.Constant, local: frozenset[str]) -> Fn:
        value = node.value
        if value is not None and type(value) not in (bool, int, float, str):
            raise self.error(node, f"{type(value).__name__} literals not allowed")
        return lambda ctx: value

    def _Name(self, node: ast.Name, local: frozenset[str]) -> Fn:
        name = node.id
        if name in _ALIASES and name not in local:
            value = _ALIASES[name]
            return lambda ctx: value
        if _is_dunder(name) or (name not in local and name not in self.allowed):
            raise self.error(node, f"unknown name {name!r}")
        if name not in local:
            self.free.add(name)

        def lookup(ctx: Mapping[str, Any]) -> Any:
            try:
                return ctx[name]
            except KeyError:
                raise EvalError(f"name {name!r} is not set in the context") from None

        return lookup

    def _Attribute(self, node: ast.Attribute, local: frozenset[str]) -> Fn:
        value = self.compile(node.value, local)  # first, so the leftmost problem is the one reported
        if _is_dunder(node.attr):
            raise self.error(node, f"attribute {node.attr!r} not allowed")
        return self._lookup(value, node.value, node.attr)

    def _Subscript(self, node: ast.Subscript, local: frozenset[str]) -> Fn:
        key = node.slice
        value, inner = self.compile(node.value, local), node.value
        if isinstance(key, ast.Constant) and type(key.value) in (str, int):
            return self._lookup(value, inner, key.value)
        if isinstance(key, ast.Slice):
            parts = [self.compile(p, local) if p else (lambda ctx: None) for p in (key.lower, key.upper, key.step)]
            lower, upper, step = parts

            def slice_(ctx: Mapping[str, Any]) -> Any:
                obj = value(ctx)
                if not isinstance(obj, list | tuple | str):
                    raise EvalError(f"cannot slice {ast.unparse(inner)}: it is {_type_name(obj)}")
                try:
                    part = obj[lower(ctx) : upper(ctx) : step(ctx)]
                except (TypeError, ValueError) as e:
                    raise EvalError(f"bad slice of {ast.unparse(inner)}: {e}") from None
                _meter().build(len(part))
                return part

            return slice_
        index = self.compile(key, local)

        def subscript(ctx: Mapping[str, Any]) -> Any:
            obj, k = value(ctx), index(ctx)
            try:
                return obj[k]
            except (KeyError, IndexError, TypeError):
                raise _lookup_error(obj, k, inner) from None

        return subscript

    def _lookup(self, value: Fn, inner: ast.expr, key: str | int) -> Fn:
        def lookup(ctx: Mapping[str, Any]) -> Any:
            obj = value(ctx)
            try:
                return obj[key]
            except (KeyError, IndexError, TypeError):
                raise _lookup_error(obj, key, inner) from None

        return lookup

    def _BinOp(self, node: ast.BinOp, local: frozenset[str]) -> Fn:
        if type(node.op) not in _BINOPS:
            raise self.error(node, f"operator '{_op_text(node.op)}' not allowed")
        symbol, op = _BINOPS[type(node.op)]
        left, right = self.compile(node.left, local), self.compile(node.right, local)

        def binop(ctx: Mapping[str, Any]) -> Any:
            a, b = left(ctx), right(ctx)
            try:
                return op(a, b)
            except ZeroDivisionError:
                raise EvalError(f"division by zero in {ast.unparse(node)}") from None
            except ArithmeticError as e:
                raise EvalError(f"{e} in {ast.unparse(node)}") from None
            except TypeError:
                raise EvalError(
                    f"cannot apply '{symbol}' to {_type_name(a)} and {_type_name(b)} in {ast.unparse(node)}"
                ) from None

        return binop

    def _UnaryOp(self, node: ast.UnaryOp, local: frozenset[str]) -> Fn:
        operand = self.compile(node.operand, local)
        if isinstance(node.op, ast.Not):
            return lambda ctx: not operand(ctx)
        if isinstance(node.op, ast.Invert):
            raise self.error(node, "operator '~' not allowed")
        symbol, op = ("-", operator.neg) if isinstance(node.op, ast.USub) else ("+", operator.pos)

        def unary(ctx: Mapping[str, Any]) -> Any:
            v = operand(ctx)
            if isinstance(v, int | float):
                return op(v)
            raise EvalError(f"cannot apply unary '{symbol}' to {_type_name(v)} in {ast.unparse(node)}")

        return unary

    def _BoolOp(self, node: ast.BoolOp, local: frozenset[str]) -> Fn:
        first, *rest = [self.compile(v, local) for v in node.values]
        if len(rest) == 1:
            second = rest[0]
            if isinstance(node.op, ast.And):
                return lambda ctx: first(ctx) and second(ctx)
            return lambda ctx: first(ctx) or second(ctx)
        is_and = isinstance(node.op, ast.And)

        def boolop(ctx: Mapping[str, Any]) -> Any:
            v = first(ctx)
            for f in rest:
                if bool(v) is not is_and:
                    return v
                v = f(ctx)
            return v

        return boolop

    def _Compare(self, node: ast.Compare, local: frozenset[str]) -> Fn:
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, ast.Is | ast.IsNot) and not (
                isinstance(right, ast.Constant) and any(right.value is c for c in (None, True, False))
            ):
                raise self.error(node, "'is' / 'is not' only allowed with None, True or False; use '=='")
        left = self.compile(node.left, local)
        pairs = [(_CMPOPS[type(op)], self.compile(r, local)) for op, r in zip(node.ops, node.comparators, strict=True)]

        def fail(a: Any, b: Any) -> EvalError:
            return EvalError(f"cannot compare {_type_name(a)} and {_type_name(b)} in {ast.unparse(node)}")

        if len(pairs) == 1:
            (op, right), r_node = pairs[0], node.comparators[0]
            if isinstance(r_node, ast.Constant):  # common case `x.status == 'done'`: skip one closure call
                const = r_node.value

                def compare_const(ctx: Mapping[str, Any]) -> bool:
                    a = left(ctx)
                    try:
                        return op(a, const)
                    except TypeError:
                        raise fail(a, const) from None

                return compare_const

            def compare(ctx: Mapping[str, Any]) -> bool:
                a, b = left(ctx), right(ctx)
                try:
                    return op(a, b)
                except TypeError:
                    raise fail(a, b) from None

            return compare

        def chain(ctx: Mapping[str, Any]) -> bool:
            a = left(ctx)
            for op, right in pairs:
                b = right(ctx)
                try:
                    if not op(a, b):
                        return False
                except TypeError:
                    raise fail(a, b) from None
                a = b
            return True

        return chain

    def _IfExp(self, node: ast.IfExp, local: frozenset[str]) -> Fn:
        test, body, orelse = (self.compile(n, local) for n in (node.test, node.body, node.orelse))
        return lambda ctx: body(ctx) if test(ctx) else orelse(ctx)

    def _List(self, node: ast.List | ast.Tuple, local: frozenset[str]) -> Fn:
        elts = [self.compile(e, local) for e in node.elts]
        return lambda ctx: [e(ctx) for e in elts]  # a fresh list each time: effects may mutate it

    _Tuple = _List

    def _Dict(self, node: ast.Dict, local: frozenset[str]) -> Fn:
        if any(k is None for k in node.keys):
            raise self.error(node, "'**' unpacking not allowed")
        pairs = [(self.compile(k, local), self.compile(v, local)) for k, v in zip(node.keys, node.values, strict=True)]

        def dict_(ctx: Mapping[str, Any]) -> dict[Any, Any]:
            try:
                return {k(ctx): v(ctx) for k, v in pairs}
            except TypeError:
                raise EvalError(f"unhashable key in {ast.unparse(node)}") from None

        return dict_

    def _comprehension(
        self, node: ast.ListComp | ast.GeneratorExp | ast.DictComp, local: frozenset[str], body: list[ast.expr]
    ) -> tuple[frozenset[str], Callable[[int, dict[str, Any]], Iterator[None]]]:
        """Compile the `for`/`if` clauses into `loop(scope)`, which binds variables and yields per match.

        The caller compiles the element (`body`) and then gives the clauses back (`self.loops`)."""
        stages = []
        self.loops += len(node.generators)
        if self.loops > MAX_LOOPS:
            raise self.error(node, f"more than {MAX_LOOPS} comprehension clauses nested in one another")
        for gen in node.generators:
            if gen.is_async:
                raise self.error(node, "async comprehensions not allowed")
            iter_fn = self.compile(gen.iter, local)
            targets = gen.target.elts if isinstance(gen.target, ast.Tuple | ast.List) else [gen.target]
            if not all(isinstance(t, ast.Name) for t in targets):
                raise self.error(gen.target, "comprehension variables must be plain names")
            names = tuple(t.id for t in targets if isinstance(t, ast.Name))
            for name in names:
                if _is_dunder(name) or name in _ALIASES:
                    raise self.error(gen.target, f"bad comprehension variable {name!r}")
            local = local | set(names)
            unpack = isinstance(gen.target, ast.Tuple | ast.List)
            cost = _loop_cost(node, gen, body)
            stages.append((iter_fn, gen.iter, names, unpack, [self.compile(c, local) for c in gen.ifs], cost))

        def run(stage: int, scope: dict[str, Any]) -> Iterator[None]:
            iter_fn, iter_node, names, unpack, conds, cost = stages[stage]
            last = stage == len(stages) - 1
            items = _iterable(iter_fn(scope), iter_node)
            # Charged up front, every item as if evaluated: one call per loop rather than per item, and an
            # over-budget loop stops before it runs (an any() that would stop early is charged in full).
            _meter().step(cost * len(items))
            for item in items:
                if unpack:
                    if not isinstance(item, list | tuple) or len(item) != len(names):
                        raise EvalError(f"cannot unpack {_type_name(item)} into {', '.join(names)}")
                    scope.update(zip(names, item, strict=True))
                else:
                    scope[names[0]] = item
                for cond in conds:
                    if not cond(scope):
                        break
                else:
                    if last:
                        yield
                    else:
                        yield from run(stage + 1, scope)

        return local, run

    def _ListComp(self, node: ast.ListComp | ast.GeneratorExp, local: frozenset[str], lazy: bool = False) -> Fn:
        inner, run = self._comprehension(node, local, [node.elt])
        elt = self.compile(node.elt, inner)
        self.loops -= len(node.generators)
        if lazy:

            def generate(ctx: Mapping[str, Any]) -> Iterator[Any]:
                scope = dict(ctx)
                return (elt(scope) for _ in run(0, scope))

            return generate

        def listcomp(ctx: Mapping[str, Any]) -> list[Any]:
            scope = dict(ctx)
            return [elt(scope) for _ in run(0, scope)]

        return listcomp

    # A generator expression is a list, except as the argument of a consumer such as any() (see _Call).
    _GeneratorExp = _ListComp

    def _DictComp(self, node: ast.DictComp, local: frozenset[str]) -> Fn:
        inner, run = self._comprehension(node, local, [node.key, node.value])
        key, value = self.compile(node.key, inner), self.compile(node.value, inner)
        self.loops -= len(node.generators)

        def dictcomp(ctx: Mapping[str, Any]) -> dict[Any, Any]:
            scope = dict(ctx)
            try:
                return {key(scope): value(scope) for _ in run(0, scope)}
            except TypeError:
                raise EvalError(f"unhashable key in {ast.unparse(node)}") from None

        return dictcomp

    def _Call(self, node: ast.Call, local: frozenset[str]) -> Fn:
        if not isinstance(node.func, ast.Name):
            raise self.error(node, "only plain function calls are allowed (no methods); e.g. lower(s)")
        name = node.func.id
        if name not in _FUNCTIONS:
            raise self.error(node, f"unknown function {name!r}")
        fn, lo, hi, kw_names = _FUNCTIONS[name]
        n = len(node.args)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.error(node, "argument unpacking not allowed")
        if n < lo or (hi is not None and n > hi):
            expected = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi else f"at least {lo}"
            raise self.error(node, f"{name}() takes {expected} positional argument(s), got {n}")
        for k in node.keywords:
            if k.arg not in kw_names:
                raise self.error(node, f"{name}() has no keyword argument {k.arg!r}")
        args = []
        for i, a in enumerate(node.args):
            if name == "matches" and i == 1:
                if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                    raise self.error(a, "matches() needs a string literal pattern")
                try:
                    pattern = re2.compile(a.value, _RE2_OPTIONS)
                except re2.error as e:
                    problem = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
                    raise self.error(a, f"bad regular expression (RE2 syntax): {problem}") from None
                args.append(lambda ctx, p=pattern: p)
            elif isinstance(a, ast.GeneratorExp) and name in _LAZY_CONSUMERS:
                args.append(self._ListComp(a, local, lazy=True))
            else:
                args.append(self.compile(a, local))
        kwargs = [(k.arg, self.compile(k.value, local)) for k in node.keywords]

        def fail(e: Exception) -> EvalError:
            return EvalError(f"{name}(): {e} in {ast.unparse(node)}")

        scans = name not in _CONSTANT_TIME

        if len(args) == 1 and not kwargs:  # the common case, without building argument lists
            arg = args[0]

            def call1(ctx: Mapping[str, Any]) -> Any:
                v = arg(ctx)
                if scans:
                    _scanned(v)
                try:
                    return _charged(fn(v))
                except _CALL_ERRORS as e:
                    raise fail(e) from None

            return call1

        def call(ctx: Mapping[str, Any]) -> Any:
            values = [a(ctx) for a in args]
            named = {k: v(ctx) for k, v in kwargs}
            if scans:
                for v in values:
                    _scanned(v)
            try:
                return _charged(fn(*values, **named))
            except _CALL_ERRORS as e:
                raise fail(e) from None

        return call


class _Unsupported(Exception):
    """A construct the translator leaves to the closures."""


def _loop(items: Any, cost: int) -> Any:
    if not isinstance(items, list | tuple | str | Mapping):
        raise _Unsupported  # the closures say what it is
    _meter().step(cost * len(items))
    return items


def _in(item: Any, container: Any) -> bool:
    return _scanned(container) and item in container


def _sign(negate: bool) -> Callable[[Any], Any]:
    def sign(value: Any) -> Any:
        if isinstance(value, int | float):
            return -value if negate else +value
        raise _Unsupported

    return sign


def _cut(obj: Any, lower: Any, upper: Any, step: Any) -> Any:
    if not isinstance(obj, list | tuple | str):
        raise _Unsupported
    part = obj[lower:upper:step]
    _meter().build(len(part))
    return part


def _wrapped(name: str) -> Callable[..., Any]:
    """The whitelisted function `name` as the translated code calls it: scans and results charged as `_Call`'s
    closures charge them."""
    fn = _FUNCTIONS[name][0]
    if name in _CONSTANT_TIME:
        return lambda *values, **named: _charged(fn(*values, **named))

    def call(*values: Any, **named: Any) -> Any:
        for v in values:
            _scanned(v)
        return _charged(fn(*values, **named))

    return call


# What translated code can reach: these names, the functions it calls (`_f_<name>`) and its patterns (`_p<n>`),
# nothing else (no builtins).
_RUNTIME: dict[str, Any] = {
    "__builtins__": {},
    "_loop": _loop,
    "_in": _in,
    "_neg": _sign(True),
    "_pos": _sign(False),
    "_cut": _cut,
    "_add": _add,
    "_mul": _mul,
    "_mod": _mod,
}
_PLAIN_BINOPS = (ast.Sub, ast.Div, ast.FloorDiv)
_PLAIN_CMPOPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot)


class _Translator:
    """Translates an expression that `_Compiler` has accepted into a Python function, built from a syntax tree
    of our own: names of the context become `ctx['name']`, comprehension variables `v_name`, every operation
    that the closures meter or restrict calls one of `_RUNTIME`'s helpers, and the code runs with no builtins.
    Only what it can translate with the closures' exact results is translated (`_Unsupported` otherwise);
    failures are left to the closures (see `Expr`). Source text is never compiled."""

    def __init__(self) -> None:
        self.reach: dict[str, Any] = dict(_RUNTIME)  # the globals of the translated function

    def function(self, node: ast.expr) -> Fn | None:
        try:
            body = self.expr(node, frozenset())
            lam = ast.Lambda(
                ast.arguments(posonlyargs=[], args=[ast.arg("ctx")], kwonlyargs=[], kw_defaults=[], defaults=[]),
                body,
            )
            with warnings.catch_warnings():  # e.g. "'bool' object is not subscriptable": the closures report it
                warnings.simplefilter("ignore", SyntaxWarning)
                code = compile(ast.fix_missing_locations(ast.Expression(lam)), "<spec expression>", "eval")
        except (_Unsupported, RecursionError, ValueError, SyntaxError):
            return None
        inner = next(c for c in code.co_consts if isinstance(c, types.CodeType))
        return types.FunctionType(inner, self.reach)

    def expr(self, node: ast.expr, local: frozenset[str]) -> ast.expr:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise _Unsupported
        return method(node, local)

    @staticmethod
    def _call(helper: str, *args: ast.expr, keywords: list[ast.keyword] | None = None) -> ast.expr:
        return ast.Call(ast.Name(helper, ast.Load()), list(args), keywords or [])

    def _Constant(self, node: ast.Constant, local: frozenset[str]) -> ast.expr:
        return ast.Constant(node.value)

    def _Name(self, node: ast.Name, local: frozenset[str]) -> ast.expr:
        if node.id in local:
            return ast.Name(f"v_{node.id}", ast.Load())
        if node.id in _ALIASES:
            return ast.Constant(_ALIASES[node.id])
        return ast.Subscript(ast.Name("ctx", ast.Load()), ast.Constant(node.id), ast.Load())

    def _Attribute(self, node: ast.Attribute, local: frozenset[str]) -> ast.expr:
        return ast.Subscript(self.expr(node.value, local), ast.Constant(node.attr), ast.Load())

    def _Subscript(self, node: ast.Subscript, local: frozenset[str]) -> ast.expr:
        value = self.expr(node.value, local)
        if isinstance(node.slice, ast.Slice):
            bounds = [
                self.expr(b, local) if b else ast.Constant(None)
                for b in (node.slice.lower, node.slice.upper, node.slice.step)
            ]
            return self._call("_cut", value, *bounds)
        return ast.Subscript(value, self.expr(node.slice, local), ast.Load())

    def _BinOp(self, node: ast.BinOp, local: frozenset[str]) -> ast.expr:
        left, right = self.expr(node.left, local), self.expr(node.right, local)
        if isinstance(node.op, _PLAIN_BINOPS):
            return ast.BinOp(left, type(node.op)(), right)
        helper = {ast.Add: "_add", ast.Mult: "_mul", ast.Mod: "_mod"}[type(node.op)]
        return self._call(helper, left, right)

    def _UnaryOp(self, node: ast.UnaryOp, local: frozenset[str]) -> ast.expr:
        operand = self.expr(node.operand, local)
        if isinstance(node.op, ast.Not):
            return ast.UnaryOp(ast.Not(), operand)
        return self._call("_neg" if isinstance(node.op, ast.USub) else "_pos", operand)

    def _BoolOp(self, node: ast.BoolOp, local: frozenset[str]) -> ast.expr:
        return ast.BoolOp(type(node.op)(), [self.expr(v, local) for v in node.values])

    def _Compare(self, node: ast.Compare, local: frozenset[str]) -> ast.expr:
        if len(node.ops) != 1:
            raise _Unsupported  # chains are rare: the closures evaluate them
        op, left, right = node.ops[0], self.expr(node.left, local), self.expr(node.comparators[0], local)
        if isinstance(op, _PLAIN_CMPOPS):
            return ast.Compare(left, [type(op)()], [right])
        test = self._call("_in", left, right)
        return test if isinstance(op, ast.In) else ast.UnaryOp(ast.Not(), test)

    def _IfExp(self, node: ast.IfExp, local: frozenset[str]) -> ast.expr:
        return ast.IfExp(*(self.expr(n, local) for n in (node.test, node.body, node.orelse)))

    def _List(self, node: ast.List | ast.Tuple, local: frozenset[str]) -> ast.expr:
        return ast.List([self.expr(e, local) for e in node.elts], ast.Load())

    _Tuple = _List

    def _Dict(self, node: ast.Dict, local: frozenset[str]) -> ast.expr:
        return ast.Dict([self.expr(k, local) for k in node.keys], [self.expr(v, local) for v in node.values])  # type: ignore[arg-type]

    def _generators(
        self, node: ast.ListComp | ast.GeneratorExp | ast.DictComp, local: frozenset[str], body: list[ast.expr]
    ) -> tuple[list[ast.comprehension], frozenset[str]]:
        out = []
        for gen in node.generators:
            if not isinstance(gen.target, ast.Name):
                raise _Unsupported  # unpacking checks its items: the closures do it
            items = self._call("_loop", self.expr(gen.iter, local), ast.Constant(_loop_cost(node, gen, body)))
            local = local | {gen.target.id}
            target = ast.Name(f"v_{gen.target.id}", ast.Store())
            out.append(ast.comprehension(target, items, [self.expr(c, local) for c in gen.ifs], 0))
        return out, local

    def _ListComp(self, node: ast.ListComp | ast.GeneratorExp, local: frozenset[str], lazy: bool = False) -> ast.expr:
        generators, inner = self._generators(node, local, [node.elt])
        kind = ast.GeneratorExp if lazy else ast.ListComp
        return kind(self.expr(node.elt, inner), generators)

    _GeneratorExp = _ListComp

    def _DictComp(self, node: ast.DictComp, local: frozenset[str]) -> ast.expr:
        generators, inner = self._generators(node, local, [node.key, node.value])
        return ast.DictComp(self.expr(node.key, inner), self.expr(node.value, inner), generators)

    def _Call(self, node: ast.Call, local: frozenset[str]) -> ast.expr:
        name = node.func.id  # type: ignore[attr-defined]  # _Compiler accepted only whitelisted plain names
        args = []
        for i, a in enumerate(node.args):
            if name == "matches" and i == 1:
                key = f"_p{len(self.reach)}"
                self.reach[key] = re2.compile(a.value, _RE2_OPTIONS)  # type: ignore[attr-defined]
                args.append(ast.Name(key, ast.Load()))
            elif isinstance(a, ast.GeneratorExp) and name in _LAZY_CONSUMERS:
                args.append(self._ListComp(a, local, lazy=True))
            else:
                args.append(self.expr(a, local))
        keywords = [ast.keyword(k.arg, self.expr(k.value, local)) for k in node.keywords]
        self.reach[f"_f_{name}"] = _wrapped(name)
        return self._call(f"_f_{name}", *args, keywords=keywords)


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


def _op_text(op: ast.AST) -> str:
    return {
        ast.Pow: "**",
        ast.BitOr: "|",
        ast.BitAnd: "&",
        ast.BitXor: "^",
        ast.LShift: "<<",
        ast.RShift: ">>",
        ast.MatMult: "@",
    }.get(type(op), type(op).__name__)


def _parse(source: Any) -> tuple[str, ast.expr]:
    if not isinstance(source, str):
        raise ExprError(repr(source), f"expression must be a string, got {_type_name(source)}")
    text = source.strip()
    if not text:
        raise ExprError(source, "empty expression")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ExprError(text, f"syntax error: {e.msg}", e.offset or None) from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ExprError(text, f"cannot parse: {e}") from None
    if _size(node) > MAX_NODES:
        raise ExprError(text, f"expression too large: more than {MAX_NODES} syntax nodes")
    return text, node


def _build(compiler: _Compiler, node: ast.expr) -> Fn:
    try:
        return compiler.compile(node)
    except RecursionError:
        raise ExprError(compiler.source, "expression too deeply nested") from None


def compile_expr(source: str, names: Iterable[str]) -> Expr:
    """Compile `source`; it may read only `names` (plus comprehension variables)."""
    text, node = _parse(source)
    compiler = _Compiler(text, names)
    fn = _build(compiler, node)
    return Expr(text, frozenset(compiler.free), fn, fast=_Translator().function(node))


class Target:
    """A compiled assignment target such as `state.orders[args.order_id].status`."""

    __slots__ = ("_paths", "names", "root", "segments", "source")

    def __init__(
        self, source: str, root: str, segments: tuple[Any, ...], paths: tuple[ast.AST, ...], names: frozenset[str]
    ) -> None:
        self.source, self.root, self.segments, self.names = source, root, segments, names
        self._paths = paths  # the AST of each prefix, for error messages

    def locate(self, ctx: Mapping[str, Any]) -> tuple[Any, Any]:
        """Walk all but the last segment; return (container, last_key).

        Raises EvalError if a segment is missing or the container cannot take the key.
        """
        try:
            obj = ctx[self.root]
        except KeyError:
            raise EvalError(f"name {self.root!r} is not set in the context") from None
        keys = [s(ctx) if isinstance(s, Expr) else s for s in self.segments]
        for key, path in zip(keys[:-1], self._paths, strict=False):
            try:
                obj = obj[key]
            except (KeyError, IndexError, TypeError):
                raise _lookup_error(obj, key, path) from None
        key, path = keys[-1], self._paths[-1]
        if isinstance(obj, Mapping):
            try:
                hash(key)
            except TypeError:
                raise EvalError(f"unhashable key {key!r} for {ast.unparse(path)}") from None
        elif isinstance(obj, list):
            if type(key) is not int:
                raise EvalError(f"index into {ast.unparse(path)} must be an integer, got {_type_name(key)}")
        else:
            raise EvalError(f"cannot assign into {ast.unparse(path)}: it is {_type_name(obj)}")
        return obj, key

    def __reduce__(self) -> tuple[Any, ...]:
        return compile_target, (self.source, self.names)

    def __repr__(self) -> str:
        return f"Target({self.source!r})"


def compile_target(source: str, names: Iterable[str]) -> Target:
    """Compile an assignment target: a chain of `.key` / `[expr]` accesses rooted at an allowed name.

    `state.orders[args.order_id].status` -> root 'state', segments ('orders', <Expr args.order_id>, 'status').
    At least one segment is required. Subscript keys are full expressions compiled with the same names.
    """
    text, node = _parse(source)
    compiler = _Compiler(text, names)
    chain: list[ast.Attribute | ast.Subscript] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        chain.append(node)
        node = node.value
    if not isinstance(node, ast.Name) or node.id in _ALIASES or not chain:
        raise compiler.error(node, "a target must be a name followed by .key or [key] accesses")
    compiler.compile(node)  # checks the root name and records it
    segments: list[Any] = []
    for link in reversed(chain):
        if isinstance(link, ast.Attribute):
            if _is_dunder(link.attr):
                raise compiler.error(link, f"attribute {link.attr!r} not allowed")
            segments.append(link.attr)
        elif isinstance(link.slice, ast.Slice):
            raise compiler.error(link, "slices cannot be assigned to")
        elif isinstance(link.slice, ast.Constant) and type(link.slice.value) in (str, int):
            segments.append(link.slice.value)
        else:
            key = _Compiler(text, compiler.allowed)
            fn = _build(key, link.slice)
            compiler.free |= key.free
            segments.append(Expr(ast.unparse(link.slice), frozenset(key.free), fn))
    paths = (node, *(link for link in reversed(chain)))[:-1]
    return Target(text, node.id, tuple(segments), paths, frozenset(compiler.free))


def render(template: str, names: Iterable[str]) -> Expr:
    """Compile a message template with {expression} placeholders into an Expr returning a str.

    `{{` and `}}` are literal braces; values are formatted with str().
    """
    if isinstance(names, str):
        raise TypeError("names must be an iterable of names, not a single string")
    names = frozenset(names)
    parts: list[str | Expr] = []
    literal: list[str] = []
    i, n = 0, len(template)
    while i < n:
        c = template[i]
        if c in "{}" and template[i + 1 : i + 2] == c:
            literal.append(c)
            i += 2
        elif c == "}":
            raise ExprError(template, "single '}' in template (write '}}' for a literal brace)", i + 1)
        elif c == "{":
            end = _placeholder_end(template, i)
            if literal:
                parts.append("".join(literal))
                literal = []
            try:
                parts.append(compile_expr(template[i + 1 : end], names))
            except ExprError as e:
                raise ExprError(template, f"bad placeholder {{{e.source}}}: {e.problem}", i + 1) from None
            i = end + 1
        else:
            literal.append(c)
            i += 1
    if literal:
        parts.append("".join(literal))
    used: frozenset[str] = frozenset().union(*(p.names for p in parts if isinstance(p, Expr)))
    if not used and all(type(p) is str for p in parts):
        text = "".join(p for p in parts if type(p) is str)
        return Expr(template, used, lambda ctx: text, template=True)
    if len(parts) == 1 and isinstance(parts[0], Expr):
        only = parts[0]
        return Expr(template, used, lambda ctx: str(only(ctx)), template=True)
    frozen = tuple(parts)
    return Expr(
        template,
        used,
        lambda ctx: "".join([p if type(p) is str else str(p(ctx)) for p in frozen]),
        template=True,
    )


def _placeholder_end(template: str, start: int) -> int:
    """Index of the `}` closing the placeholder opened at `start` (skips nested brackets and strings)."""
    depth, quote, i = 0, "", start + 1
    while i < len(template):
        c = template[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            if depth == 0:
                if c == "}":
                    return i
                break
            depth -= 1
        i += 1
    raise ExprError(template, "unclosed '{' in template", start + 1)
