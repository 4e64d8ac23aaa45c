"""The fast form of an expression: the tree _compiler.py has checked, translated into a syntax tree of our own
and compiled into a function without builtins, which reaches only `_RUNTIME`'s helpers, the whitelisted
functions it calls and its patterns. What it cannot translate with the closures' exact results is left to
them (`_Unsupported`); so are its failures (see `Expr`). Source text is never compiled."""

from __future__ import annotations

import ast
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import re2

from pipeline.expr._budget import _meter
from pipeline.expr._runtime import (
    _ALIASES,
    _CONSTANT_TIME,
    _FUNCTIONS,
    _LAZY_CONSUMERS,
    _RE2_OPTIONS,
    Fn,
    _add,
    _charged,
    _loop_cost,
    _mod,
    _mul,
    _scanned,
)


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
        method: Callable[[ast.expr, frozenset[str]], ast.expr] | None = getattr(self, f"_{type(node).__name__}", None)
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
        keys = [k for k in node.keys if k is not None]  # None: `**` unpacking, which _Compiler refused
        if len(keys) < len(node.keys):
            raise _Unsupported
        return ast.Dict([self.expr(k, local) for k in keys], [self.expr(v, local) for v in node.values])

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
        if not isinstance(node.func, ast.Name):  # never: _Compiler accepted only whitelisted plain names
            raise _Unsupported
        name = node.func.id
        args: list[ast.expr] = []
        for i, a in enumerate(node.args):
            if name == "matches" and i == 1:
                if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):  # never: _Compiler refused it
                    raise _Unsupported
                key = f"_p{len(self.reach)}"
                self.reach[key] = re2.compile(a.value, _RE2_OPTIONS)
                args.append(ast.Name(key, ast.Load()))
            elif isinstance(a, ast.GeneratorExp) and name in _LAZY_CONSUMERS:
                args.append(self._ListComp(a, local, lazy=True))
            else:
                args.append(self.expr(a, local))
        keywords = [ast.keyword(k.arg, self.expr(k.value, local)) for k in node.keywords]
        self.reach[f"_f_{name}"] = _wrapped(name)
        return self._call(f"_f_{name}", *args, keywords=keywords)
