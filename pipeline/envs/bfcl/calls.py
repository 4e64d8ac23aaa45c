"""BFCL call strings -> (name, arguments), with `ast`: one decoded call (`cd(folder='document')`,
`sort('a.txt')`), or a prompt-mode model's whole response (`[cd(folder='document'), ls()]`).

Only literal arguments are accepted (ast.literal_eval on each argument node: never eval/exec). Positional
arguments are named through the function's parameter order.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import Any


class CallSyntaxError(ValueError):
    """The text is not a single call with literal arguments."""


ParameterOrder = Callable[[str], Sequence[str] | None]


def parse_call(text: str, parameter_order: ParameterOrder) -> tuple[str, dict[str, Any]]:
    """(function name, keyword arguments) of one call string.

    `parameter_order(name)` gives the parameter names in signature order (None when the function is unknown:
    positional arguments then cannot be named).
    """
    node = _expression(text.strip(), text)
    if not isinstance(node, ast.Call):
        raise CallSyntaxError(f"not a call: {text!r}")
    return _call(node, parameter_order)


def parse_call_list(text: str, parameter_order: ParameterOrder) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a prompt-mode response, decoded as BFCL's default prompting handler does: surrounding
    backticks, newlines and spaces dropped, brackets added when missing, then a list of calls."""
    body = text.strip("`\n ")
    body = ("" if body.startswith("[") else "[") + body + ("" if body.endswith("]") else "]")
    node = _expression(body, text)
    items = node.elts if isinstance(node, ast.List) else None
    calls = [item for item in items or () if isinstance(item, ast.Call)]
    if items is None or len(calls) < len(items):
        raise CallSyntaxError(f"not a list of calls: {text[:80]!r}")
    return [_call(item, parameter_order) for item in calls]


def _expression(source: str, text: str) -> ast.expr:
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError as exc:
        raise CallSyntaxError(f"not a call: {text[:80]!r} ({exc.msg})") from exc


def _call(node: ast.Call, parameter_order: ParameterOrder) -> tuple[str, dict[str, Any]]:
    name = _name(node.func)
    args: dict[str, Any] = {}
    if node.args:
        order = parameter_order(name)
        if order is None:
            raise CallSyntaxError(f"{name}: positional arguments of an unknown function")
        if len(node.args) > len(order):
            raise CallSyntaxError(f"{name}: {len(node.args)} positional arguments, the function takes {len(order)}")
        for param, value in zip(order, node.args, strict=False):
            args[param] = _literal(value, name)
    for keyword in node.keywords:
        if keyword.arg is None:
            raise CallSyntaxError(f"{name}: **kwargs are not literal arguments")
        if keyword.arg in args:
            raise CallSyntaxError(f"{name}: argument {keyword.arg!r} given twice")
        args[keyword.arg] = _literal(keyword.value, name)
    return name, args


def _name(func: ast.expr) -> str:
    # `obj.method(...)` keeps the method name: BFCL dispatches on it.
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    raise CallSyntaxError("the callee is not a name")


def _literal(node: ast.expr, name: str) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError) as exc:
        raise CallSyntaxError(f"{name}: argument is not a literal: {ast.unparse(node)}") from exc
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    # Canonical arguments are JSON: tuples and sets become lists, as BFCL's own JSON docs describe them.
    if isinstance(value, tuple | list | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
