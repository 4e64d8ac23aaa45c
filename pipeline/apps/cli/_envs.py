"""`pexec envs`: the environments `score` can use, and with --check whether each can be built."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from pipeline.apps.cli._options import SpecDir
from pipeline.apps.cli._render import out
from pipeline.core.errors import PexecError
from pipeline.core.text import literal
from pipeline.envs import EnvOptions


def envs(
    spec_dir: SpecDir = None,
    check: Annotated[
        bool, typer.Option("--check", help="Build each environment: its version, or why it cannot be built.")
    ] = False,
) -> None:
    """The environments `score` can use: built-in, entry points, and specs on the search path."""
    from pipeline.envs import get_environment, list_environments

    options = EnvOptions(spec_dirs=tuple(spec_dir or ()))
    table = Table("environment", "from", *(["version"] if check else []))
    failed = 0
    for name, source in list_environments(options).items():
        row: list[str | Text] = [literal(name), literal(source)]
        if check:
            try:
                row.append(literal(get_environment(name, options).version))
            except PexecError as exc:  # a missing simulator package, an invalid spec: reported in its row
                failed += 1
                row.append(Text(f"cannot be built: {literal(exc)}", "red"))
        table.add_row(*row)
    out.print(table)
    if failed:
        raise typer.Exit(code=1)
