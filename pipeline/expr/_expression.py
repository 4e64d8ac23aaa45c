"""`Expr`, a compiled expression (closures, and the fast form where there is one), and the two ways to make
one: `compile_expr` from source, `render` from a message template with {expression} placeholders. They
stand together because an Expr pickles as the call that makes it again, one or the other."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.core.errors import ExprError
from pipeline.expr._budget import _CLOCK_EVERY, _PENDING, BudgetExceeded, EvalError, _active, _Meter
from pipeline.expr._compiler import _build, _Compiler, _parse
from pipeline.expr._fast import _Translator
from pipeline.expr._runtime import Fn


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


def compile_expr(source: str, names: Iterable[str]) -> Expr:
    """Compile `source`; it may read only `names` (plus comprehension variables)."""
    text, node = _parse(source)
    compiler = _Compiler(text, names)
    fn = _build(compiler, node)
    return Expr(text, frozenset(compiler.free), fn, fast=_Translator().function(node))


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
        lambda ctx: "".join([p if isinstance(p, str) else str(p(ctx)) for p in frozen]),
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
