"""`pexec publish mlflow|phoenix RUN`: put a scored run's verdicts back on the traces it was read from, where the
team already looks (MLflow assessments, Phoenix span annotations). Publishing again updates, never duplicates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.apps.cli._options import EndpointUrl, ScoredRun, StorageOption, storage
from pipeline.apps.cli._render import console
from pipeline.core.text import literal

if TYPE_CHECKING:
    from pipeline.apps.integrations.verdicts import PublishReport

publish_app = typer.Typer(no_args_is_help=True, help="Put a run's verdicts back on the traces it was read from.")


@publish_app.command("mlflow")
def mlflow(
    run: ScoredRun,
    tracking_uri: Annotated[str, typer.Option("--tracking-uri", help="The MLflow tracking server the traces are on.")],
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Write each tool span's verdict (feedback `pexec.executable`) and each trace's FED, T and executable as
    MLflow assessments of source CODE `pexec`."""
    from pipeline.apps.integrations.mlflow import publish

    _report("mlflow", publish(run, tracking_uri, storage(endpoint_url, storage_option)))


@publish_app.command("phoenix")
def phoenix(
    run: ScoredRun,
    endpoint: Annotated[str, typer.Option("--endpoint", help="The Phoenix server the traces are on (its URL).")],
    project: Annotated[str, typer.Option("--project", help="The Phoenix project the traces are in.")] = "default",
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Write each tool span's verdict (span annotation `pexec.executable`) and each trace's FED, T and executable
    (trace annotations) as Phoenix annotations of kind CODE."""
    from pipeline.apps.integrations.phoenix import publish

    _report("phoenix", publish(run, endpoint, storage(endpoint_url, storage_option), project))


def _report(store: str, report: PublishReport) -> None:
    console.print(literal(report.line(store)), soft_wrap=True)
    for trace_id, why in sorted(report.skipped.items()):
        console.print(f"skipped trace {literal(trace_id)}: {literal(why)}")
