"""`mlflow`: MLflow 3 traces -> canonical rollouts, read through MLflow's own client (extra `pexec[mlflow]`).

Not read from files: `--option tracking_uri=URI --option experiment=NAME` (on the CLI `--tracking-uri`,
`--experiment`, `--since`, `--until`) name the tracking server and the experiment; every trace of it that started
in the window is one rollout. Mapping:
- the rollout id is the trace id (default `id_field` `trace_id`), kept too as the attribute `trace_id`, which
  `pexec publish mlflow` uses to find the trace again; the fields ids, labels and success are read from are the
  trace's tags and metadata, the model span's `model` (label `model`), and `date` (UTC day the trace started);
- spans of type `TOOL` are the calls, in start order: tool = the span's name, arguments = its inputs (not
  captured: null), output = its outputs, `error` = status ERROR (then the output, when none was recorded, is the
  exception event's message, else the status message: the environment's own words);
- spans of type `CHAT_MODEL`/`LLM`: the user and system messages of their `messages` input are message events;
  the `tools` of their input (the request's tool definitions, as autolog records them) are the definitions S is
  checked against when no spec declares the tool (`env.tools`; see `pipeline.ingest.traces` for versions).
  No model span carries them: no definitions (a spec's schemas, else only well-formedness).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.core.errors import IngestError
from pipeline.ingest._logs import log_options, settings, tool_definitions
from pipeline.ingest.base import IngestOptions, LogFormat, Option
from pipeline.ingest.traces import (
    WINDOW,
    Trace,
    TraceSpan,
    check_found,
    check_spans,
    kwargs_tools,
    max_traces,
    parse_time,
    records,
)

EXTRA = "pip install 'pexec[mlflow]'"
_MODEL_TYPES = {"CHAT_MODEL", "LLM"}
PAGE = 100  # traces per search request
# MLflow's HTTP client retries a failed request for minutes by default: pexec's requests wait at most this long
# each and are retried this often (the variables MLFLOW_HTTP_REQUEST_TIMEOUT / _MAX_RETRIES, when set, win).
HTTP_TIMEOUT_S = 30
HTTP_RETRIES = 1


class MLflow(LogFormat):
    name = "mlflow"
    options = log_options(
        Option("tracking_uri", "the MLflow tracking server (`--tracking-uri`; http://HOST:PORT, or a store URI)"),
        Option("experiment", "the experiment whose traces are read, by name (`--experiment`)"),
        *WINDOW,
        id_field="trace_id",
    )
    reads_files = False

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        s = settings("mlflow", options)
        if sources:
            raise IngestError("mlflow: reads from a tracking server (--tracking-uri, --experiment), not from files")
        uri, name = s.own.get("tracking_uri"), s.own.get("experiment")
        if not uri or not name:
            raise IngestError(
                "mlflow: give the tracking server and the experiment: --tracking-uri URI --experiment NAME"
            )
        since = parse_time(s.own.get("since"), "since", "mlflow")
        until = parse_time(s.own.get("until"), "until", "mlflow")
        c = client(uri)  # first: it says when the extra is missing
        from mlflow.exceptions import MlflowException

        try:
            traces = list(_traces(c, uri, name, since, until, max_traces(s)))
        except MlflowException as exc:  # the server unreachable or refusing: its message, on one line
            raise IngestError(f"mlflow: {uri}: {exc.message}") from exc
        check_found(traces, f"mlflow: experiment {name!r} at {uri}", since, until)
        yield from records(s, traces)


FORMAT = MLflow()


def client(uri: str) -> Any:
    """MLflow's own client for the server at `uri` (an IngestError naming the extra when it is not installed)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise IngestError(f"mlflow: the MLflow client is not installed ({EXTRA})") from exc
    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client: Any, name: str, uri: str) -> str:
    found = mlflow_client.get_experiment_by_name(name)
    if found is None:
        raise IngestError(f"mlflow: no experiment named {name!r} at {uri}")
    return str(found.experiment_id)


def _traces(c: Any, uri: str, name: str, since: Any, until: Any, limit: int) -> Iterator[Trace]:
    where = [f"trace.timestamp_ms >= {int(since.timestamp() * 1000)}"] if since else []
    where += [f"trace.timestamp_ms < {int(until.timestamp() * 1000)}"] if until else []
    ids = [experiment_id(c, name, uri)]
    token, n = None, 0
    while True:
        page = c.search_traces(locations=ids, filter_string=" AND ".join(where) or None, max_results=PAGE,
                               order_by=["timestamp_ms ASC"], page_token=token)  # fmt: skip
        for trace in page:
            n += 1
            if n > limit:
                raise IngestError(f"mlflow: experiment {name!r} has more than {limit} traces in the window "
                                  "(narrow it with --since/--until, or raise --option max_traces)")  # fmt: skip
            yield reduce(trace)
        token = page.token
        if not token:
            return


def reduce(trace: Any) -> Trace:
    """An MLflow `Trace` as the spans a rollout needs."""
    info = trace.info
    check_spans("mlflow", info.trace_id, len(trace.data.spans))
    spans = tuple(_span(sp) for sp in trace.data.spans)
    fields: dict[str, Any] = {**(info.trace_metadata or {}), **(info.tags or {})}
    model = next((m for sp in trace.data.spans if sp.span_type in _MODEL_TYPES and (m := _model(sp))), None)
    if model is not None:
        fields.setdefault("model", model)
    return Trace(str(info.trace_id), int(info.request_time) * 1_000_000, spans, fields)


def _span(sp: Any) -> TraceSpan:
    kind = "tool" if sp.span_type == "TOOL" else "model" if sp.span_type in _MODEL_TYPES else "other"
    status = sp.status
    error = str(getattr(status.status_code, "value", status.status_code)) == "ERROR"
    messages: tuple[Any, ...] = ()
    declared: frozenset[str] = frozenset()
    if kind == "model" and isinstance(sp.inputs, dict) and isinstance(sp.inputs.get("messages"), list):
        messages = tuple(m for m in sp.inputs["messages"] if isinstance(m, dict))
    tools = None
    if kind == "model" and isinstance(sp.inputs, dict):
        tools = tool_definitions(sp.inputs.get("tools"))
        declared = kwargs_tools(sp.inputs.get("tools"))
    return TraceSpan(
        span_id=str(sp.span_id),
        name=str(sp.name),
        kind=kind,
        start_ns=int(sp.start_time_ns or 0),
        arguments=sp.inputs if kind == "tool" else None,
        output=sp.outputs if kind == "tool" else None,
        error=error,
        error_message=(_exception(sp) or status.description) if error else None,  # the exception's own words
        messages=messages,
        tools=tools,
        kwargs_tools=declared,
    )


def _exception(sp: Any) -> str | None:
    for event in sp.events or []:
        if event.name == "exception":
            found = (event.attributes or {}).get("exception.message")
            if found:
                return str(found)
    return None


def _model(sp: Any) -> str | None:
    inputs = sp.inputs
    return str(inputs["model"]) if isinstance(inputs, dict) and inputs.get("model") else None
