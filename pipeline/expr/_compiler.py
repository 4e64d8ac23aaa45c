"""From source to closures: an expression parsed within its size limit, every node checked against the
whitelist (anything else is an `ExprError`, raised at compile time), and the checked tree compiled into
nested closures `f(ctx) -> value`, whose errors say what went wrong and where."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import re2

from pipeline.core.errors import ExprError
from pipeline.expr._budget import MAX_LOOPS, MAX_NODES, EvalError, _meter
from pipeline.expr._runtime import (
    _ALIASES,
    _BINOPS,
    _CALL_ERRORS,
    _CMPOPS,
    _CONSTANT_TIME,
    _FUNCTIONS,
    _LAZY_CONSUMERS,
    _RE2_OPTIONS,
    Fn,
    _charged,
    _iterable,
    _lookup_error,
    _loop_cost,
    _scanned,
    _size,
    _type_name,
)

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
        method: Callable[[ast.AST, frozenset[str]], Fn] | None = getattr(self, f"_{type(node).__name__}", None)
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
        if isinstance(key, ast.Constant) and (type(key.value) is str or type(key.value) is int):
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
        for cmp, operand in zip(node.ops, node.comparators, strict=True):
            if isinstance(cmp, ast.Is | ast.IsNot) and not (
                isinstance(operand, ast.Constant) and any(operand.value is c for c in (None, True, False))
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
        keys = [k for k in node.keys if k is not None]  # None: `**` unpacking
        if len(keys) < len(node.keys):
            raise self.error(node, "'**' unpacking not allowed")
        pairs = [(self.compile(k, local), self.compile(v, local)) for k, v in zip(keys, node.values, strict=True)]

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
        args: list[Fn] = []
        for i, a in enumerate(node.args):
            if name == "matches" and i == 1:
                if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                    raise self.error(a, "matches() needs a string literal pattern")
                try:
                    pattern = re2.compile(a.value, _RE2_OPTIONS)
                except re2.error as e:
                    problem = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
                    raise self.error(a, f"bad regular expression (RE2 syntax): {problem}") from None
                args.append(_constant(pattern))
            elif isinstance(a, ast.GeneratorExp) and name in _LAZY_CONSUMERS:
                args.append(self._ListComp(a, local, lazy=True))
            else:
                args.append(self.compile(a, local))
        kwargs = [(k.arg, self.compile(k.value, local)) for k in node.keywords if k.arg is not None]  # None: refused

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


def _constant(value: Any) -> Fn:
    return lambda ctx: value


# How an operator the language refuses is written, for the error (else its node's name).
_OP_TEXT: dict[type[ast.AST], str] = {
    ast.Pow: "**",
    ast.BitOr: "|",
    ast.BitAnd: "&",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
}


def _op_text(op: ast.AST) -> str:
    return _OP_TEXT.get(type(op), type(op).__name__)


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
