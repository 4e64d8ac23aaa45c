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

_budget.py      what an expression may spend: limits at compile time, the budget of every evaluation
_runtime.py     what compiled expressions run on: whitelisted functions, operators, type names, costs
_compiler.py    parsing, the whitelist check and the closures (`ExprError` at compile time)
_fast.py        the checked tree translated into a function without builtins, which runs first
_expression.py  `Expr`, `compile_expr` and `render` (message templates)
_targets.py     assignment targets (`Target`, `compile_target`)

Imports: core.
"""

from __future__ import annotations

from pipeline.core.errors import ExprError
from pipeline.expr._budget import BUDGET, Budget, BudgetExceeded, EvalError, metered
from pipeline.expr._expression import Expr, compile_expr, render
from pipeline.expr._targets import Target, compile_target

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
