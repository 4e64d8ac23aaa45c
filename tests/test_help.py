"""Every command's `--help` fits the terminal it is given, shows each default whole (no `…`), and shows a boolean
flag as a flag (no `<bool>` value type)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
import typer
from typer.testing import CliRunner

from pipeline.apps.cli import app


def commands(group: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))


ALL = list(commands(typer.main.get_command(app)))


@pytest.mark.parametrize("width", [80, 120])
def test_every_help_fits_shows_defaults_whole_and_flags_as_flags(width: int) -> None:
    assert len(ALL) > 20
    for path in ALL:
        shown = CliRunner(env={"COLUMNS": str(width)}).invoke(app, [*path, "--help"])
        assert shown.exit_code == 0, (path, shown.output)
        lines = shown.stdout.splitlines()
        assert max(len(line) for line in lines) <= width, path
        folded = "".join(line.strip("│ ") for line in lines)
        assert not re.search(r"\[default:[^\]]*…", folded) and "<bool>" not in shown.stdout, path
    checks = CliRunner(env={"COLUMNS": str(width)}).invoke(app, ["score", "--help"]).stdout
    folded = "".join(line.strip("│ ") for line in checks.splitlines())
    assert "[default:schema,dependency,precondition]" in folded.replace(" ", "")
