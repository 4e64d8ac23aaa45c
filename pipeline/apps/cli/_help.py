"""Two changes to how Typer draws `--help`, installed when the command line is built: a boolean flag shows no
value type (`--inline`, not `--inline <bool>`: it takes none), and a default or help word longer than its column
folds onto the next line instead of ending in `…` (`[default: schema,dependency,precondition]` whole at 80
columns). Typer offers no setting for either; tests/test_help.py fails if an upgrade of Typer undoes them.

Typer's help renderer (`typer.rich_utils`, with rich's Markdown, Syntax and traceback) costs about a tenth of the
command line's start, so it is patched when a help page is first drawn, not when `pexec` starts: a command that
prints no help never imports it."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from typer.core import TyperCommand, TyperGroup, TyperOption

_display_type = TyperOption.display_type_rich


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    if self.is_bool_flag:
        return None
    return _display_type(self, ctx)


@cache  # once per process: the first help page drawn patches Typer's renderer
def _fold_long_words() -> None:
    from rich.text import Text
    from typer import rich_utils

    parameter_help = rich_utils._get_parameter_help

    def whole_help(**kwargs: Any) -> Any:
        shown = parameter_help(**kwargs)
        for item in shown.renderables:
            if isinstance(item, Text):
                item.overflow = "fold"
        return shown

    rich_utils._get_parameter_help = whole_help


def _patching_first(format_help: Callable[..., None]) -> Callable[..., None]:
    def first_patched(self: Any, ctx: Any, formatter: Any) -> None:
        _fold_long_words()
        format_help(self, ctx, formatter)

    first_patched.pexec_patches = True  # type: ignore[attr-defined]
    return first_patched


def install() -> None:
    """Apply both changes (idempotent): the flag's type column now, the folding when a help page is first drawn."""
    TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]  # the flag's type column, per class
    for kind in (TyperCommand, TyperGroup):
        if not getattr(kind.format_help, "pexec_patches", False):
            kind.format_help = _patching_first(kind.format_help)  # type: ignore[method-assign]
