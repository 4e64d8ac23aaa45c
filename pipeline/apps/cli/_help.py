"""Two changes to how Typer draws `--help`, made once when the command line is built: a boolean flag shows no
value type (`--inline`, not `--inline <bool>`: it takes none), and a default or help word longer than its column
folds onto the next line instead of ending in `…` (`[default: schema,dependency,precondition]` whole at 80
columns). Typer offers no setting for either; tests/test_help.py fails if an upgrade of Typer undoes them."""

from __future__ import annotations

from typing import Any

from rich.columns import Columns
from rich.text import Text
from typer import rich_utils
from typer.core import TyperOption

_parameter_help = rich_utils._get_parameter_help
_display_type = TyperOption.display_type_rich


def _whole_help(**kwargs: Any) -> Columns:
    shown = _parameter_help(**kwargs)
    for item in shown.renderables:
        if isinstance(item, Text):
            item.overflow = "fold"
    return shown


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    if self.is_bool_flag:
        return None
    return _display_type(self, ctx)


def install() -> None:
    """Apply both changes (idempotent)."""
    rich_utils._get_parameter_help = _whole_help
    TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]  # the flag's type column, per class
