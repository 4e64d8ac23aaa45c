"""The rule engine of the rule-based environments (spec, observed, τ policy overlay, ToolSandbox):
preconditions and effects compiled from spec files in the expression language of pipeline/expr/__init__.py, and the
check that evaluates preconditions on one call.

Compile errors are `SpecError`s naming the file and the place (`where`), raised before any scoring starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import SpecError, check_fields
from pipeline.expr import BudgetExceeded, EvalError, Expr, ExprError, Target, compile_expr, compile_target, render

_PRE_KEYS = {"require", "error", "clause"}
_EFFECT_OPS = ("set", "append", "delete")
_FOR = re.compile(r"^\s*([A-Za-z_]\w*)\s+in\s+(.+)$", re.S)


@dataclass(frozen=True)
class Precondition:
    require: Expr
    error: Expr  # renders the rejection message
    clause: str | None = None  # where the rule comes from (e.g. a policy clause)


@dataclass(frozen=True)
class Effect:
    op: str  # set | append | delete
    target: Target
    value: Expr | None  # None for a delete, and only then
    each: tuple[str, Expr] | None = None  # `for = "item in args.items"`: apply once per element


@dataclass(frozen=True)
class RuleCheck:
    """The outcome of a tool's rules on one call."""

    violated: Precondition | None = None  # the first rule that does not hold
    message: str | None = None  # its rendered error
    evaluated: bool = False  # whether any rule could be evaluated at all


def check_rules(rules: Sequence[Precondition], ctx: dict[str, Any], unknown_violates: bool) -> RuleCheck:
    """Evaluate rules in order and stop at the first that does not hold.

    A rule that cannot be evaluated (a missing key, a type error) violates when `unknown_violates` — a
    simulator's own preconditions — and is skipped otherwise: an overlay or an observation-based rule
    without the evidence it needs says nothing. A rule that goes over its evaluation budget always
    violates: accepting the call would pass what was never checked.
    """
    evaluated = False
    for rule in rules:
        try:
            holds = rule.require(ctx)
        except BudgetExceeded as exc:
            return RuleCheck(rule, f"rule not evaluated: {exc}", True)
        except EvalError as exc:
            if unknown_violates:
                return RuleCheck(rule, f"{_render(rule, ctx)} ({exc})", True)
            continue
        evaluated = True
        if not holds:
            return RuleCheck(rule, _render(rule, ctx), True)
    return _HELD if evaluated else NO_RULES


# The outcomes of a call no rule rejects, made once: a frozen dataclass is slow to build, and this is every call's.
_HELD = RuleCheck(evaluated=True)
NO_RULES = RuleCheck()  # no rule was evaluated: what `check_rules` says of no rules at all


def _render(rule: Precondition, ctx: dict[str, Any]) -> str:
    try:
        message: str = rule.error(ctx)  # a template: always text
        return message
    except EvalError:  # the message reads something the context lacks: fall back to the rule itself
        return f"precondition failed: {rule.require.source}"


def compile_lets(table: Any, names: set[str], where: str) -> tuple[tuple[tuple[str, Expr], ...], set[str]]:
    """Named values (`let = {name = "expr"}`), each seeing the ones before it; returns them and the names."""
    lets = []
    for var, source in (table or {}).items():
        if var in names:
            raise SpecError(f"{where}.{var}: the name is already taken")
        lets.append((var, compile_field(source, names, f"{where}.{var}")))
        names = names | {var}
    return tuple(lets), names


def compile_preconditions(
    items: Any, names: set[str], where: str, clause_required: bool = False
) -> tuple[Precondition, ...]:
    if not isinstance(items, list):
        raise SpecError(f"{where}: expected a list of {{require, error, clause}} tables")
    pres = []
    for i, pre in enumerate(items):
        at = f"{where}[{i}]"
        check_fields(pre, _PRE_KEYS, at, SpecError)
        if "require" not in pre:
            raise SpecError(f"{at}: 'require' is required")
        if clause_required and not isinstance(pre.get("clause"), str):
            raise SpecError(f"{at}: every rule must cite its clause")
        message = pre.get("error", f"precondition failed: {pre['require']}")
        pres.append(
            Precondition(
                compile_field(pre["require"], names, at), compile_field(message, names, at, render), pre.get("clause")
            )
        )
    return tuple(pres)


def compile_effects(items: Any, names: set[str], where: str) -> tuple[Effect, ...]:
    """Effects (`{set|append|delete = "<state target>", value, for}` tables), each changing only the state."""
    effects = []
    for i, eff in enumerate(items):
        at = f"{where}[{i}]"
        ops = [op for op in _EFFECT_OPS if op in eff]
        if len(ops) != 1:
            raise SpecError(f"{at}: exactly one of {', '.join(_EFFECT_OPS)} is required")
        op = ops[0]
        check_fields(eff, {op, "value", "for"} if op != "delete" else {op, "for"}, at, SpecError)
        if op != "delete" and "value" not in eff:
            raise SpecError(f"{at}: '{op}' needs a 'value'")
        each, scope = None, names
        if "for" in eff:
            loop = _FOR.match(str(eff["for"]))
            if not loop or loop.group(1) in names:
                raise SpecError(f"{at}: 'for' must read '<new name> in <expression>', got {eff['for']!r}")
            each = (loop.group(1), compile_field(loop.group(2), names, f"{at} for"))
            scope = names | {loop.group(1)}
        try:
            target = compile_target(eff[op], scope)
        except ExprError as exc:
            raise SpecError(f"{at}: {exc}") from exc
        if target.root != "state":
            raise SpecError(f"{at}: effects may only change the state (target rooted at {target.root!r})")
        value = compile_field(eff["value"], scope, at) if op != "delete" else None
        effects.append(Effect(op, target, value, each))
    return tuple(effects)


def compile_field(source: Any, names: set[str], where: str, compiler: Callable[..., Expr] = compile_expr) -> Expr:
    """Compile one expression (or, with `compiler=render`, one message template) of a spec file."""
    if not isinstance(source, str):
        raise SpecError(f"{where}: expected a string, got {source!r}")
    try:
        return compiler(source, names)
    except ExprError as exc:
        raise SpecError(f"{where}: {exc}") from exc
