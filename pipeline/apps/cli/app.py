"""`pexec`: a thin command line over the Python API (pipeline.*)."""

from __future__ import annotations

import warnings
from importlib.metadata import version
from typing import Annotated, Any

import typer
from rich.text import Text
from typer._click.core import Command, Context  # typer 0.29 vendors click: its group takes these types
from typer.core import TyperGroup

from pipeline.apps.cli import _analysis as analysis
from pipeline.apps.cli import _bench as bench
from pipeline.apps.cli import _envs as envs
from pipeline.apps.cli import _guard as guard
from pipeline.apps.cli import _guard_replay as guard_replay
from pipeline.apps.cli import _help
from pipeline.apps.cli import _jobs as jobs
from pipeline.apps.cli import _publish as publish
from pipeline.apps.cli import _scoring as scoring
from pipeline.apps.cli import _spec as spec
from pipeline.apps.cli import _stores as stores
from pipeline.apps.cli._render import console, fit_output, show_warning
from pipeline.core.errors import PexecError, SettingError
from pipeline.core.text import literal

warnings.showwarning = show_warning
_help.install()


class _Commands(TyperGroup):
    """The one place user-facing errors end: any command's PexecError is printed as `error: <message>` on
    one line and exits 2, a setting's (SettingError) naming the option that set it. Any other exception is a bug
    and keeps its traceback."""

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except SettingError as exc:
            _fail(exc.naming(_option(self.get_command(ctx, ctx.invoked_subcommand or ""), exc)), exc)
        except PexecError as exc:
            _fail(str(exc), exc)
        except BrokenPipeError:  # the reader went away (`pexec … | head`): click stops quietly, exit code 1
            raise
        except OSError as exc:  # storage: a missing bucket or file, a refused write, an unreachable endpoint
            _fail(f"{type(exc).__name__}: {exc}", exc)
        except Exception as exc:
            if type(exc).__module__.startswith("botocore"):  # credentials, endpoint (not an OSError)
                _fail(f"{type(exc).__name__}: {exc} (see the AWS environment or --endpoint-url)", exc)
            raise


def _option(command: Command | None, exc: SettingError) -> str:
    """The option of the command's parameter named as the setting's key (`--spec-dir` for `spec_dirs`), else the
    key with dashes (the option of a sub-command's setting, such as `guard serve --policy`)."""
    params = command.params if command is not None else []
    return next((p.opts[0] for p in params if p.name == exc.key and p.opts), exc.option)


def _fail(message: str, exc: Exception) -> None:
    # Some messages carry several lines (DuckDB's); soft_wrap keeps long ones on one line too.
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    console.print(Text.assemble(("error:", "bold red"), " ", literal(message)), soft_wrap=True)
    raise typer.Exit(code=2) from exc


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, help=__doc__)


def _print_version(show: bool) -> None:
    if show:
        typer.echo(version("pexec"))
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """The options of `pexec` itself, given before any command (the app's help text comes from __doc__)."""
    fit_output()  # messages on a pipe wrap at COLUMNS (else 120), not at rich's 80


# The commands in the order `pexec --help` lists them, each in the module of its group.
app.command()(stores.synth)
app.command()(stores.ingest)
app.command()(scoring.score)
app.command()(jobs.run)
app.command()(jobs.submit)
app.command()(jobs.status)
app.command()(jobs.logs)
app.command()(jobs.stop)
app.command()(jobs.jobs)
app.command()(analysis.metrics)
app.command()(analysis.report)
app.command()(analysis.diff)
app.command()(analysis.sql)
app.command()(analysis.view)
app.command()(analysis.verify)
app.command()(envs.envs)
guard.guard_app.command("replay")(guard_replay.replay)
app.add_typer(publish.publish_app, name="publish")
app.add_typer(guard.guard_app, name="guard")
spec.spec_app.command("draft")(spec.draft)
app.add_typer(spec.spec_app, name="spec")
app.command()(bench.bench)
