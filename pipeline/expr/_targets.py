"""Assignment targets of effects, such as `state.orders[args.order_id].status`: `compile_target` checks one
and makes a `Target`, which finds the container and the key a value is written to."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.expr._budget import EvalError
from pipeline.expr._compiler import _build, _Compiler, _is_dunder, _parse
from pipeline.expr._expression import Expr
from pipeline.expr._runtime import _ALIASES, _lookup_error, _type_name


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
