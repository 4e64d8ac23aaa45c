"""Real log producers for the adapter tests (tests/test_producers*.py): one scripted support conversation, the
tools it calls, and a chat-completions stub server on loopback that plays the model's side of it.

Every producer runs the same script, so every test asserts the same known answer: four tool calls in three
model turns, call ids reused across turns (as some frameworks do: pairing must go by position), and a
`cancel_order` that raises because order O5521 has shipped. Scored by `observed` with the `support` spec:
valid, valid, invalid (P: the spec's cancellation rule over the `get_order` output the agent saw, and the
logged error), valid.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USER = "I'm ava@example.com. Please cancel order O5521, I changed my mind."
FINAL = "Order O5521 has already shipped, so it cannot be cancelled; here is its tracking."
MODEL = "stub-model"


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    tool: str
    arguments: dict[str, Any]


# The model's turns: each a list of parallel tool calls; after the last, the model answers FINAL.
SCRIPT: list[list[ToolCall]] = [
    [ToolCall("call_1", "find_customer", {"email": "ava@example.com"}),
     ToolCall("call_2", "get_order", {"order_id": "O5521"})],
    [ToolCall("call_1", "cancel_order", {"order_id": "O5521", "reason": "changed_mind"})],  # id reused
    [ToolCall("call_2", "track_shipment", {"order_id": "O5521"})],  # id reused
]  # fmt: skip
CALLS = [c for turn in SCRIPT for c in turn]
CANCEL_ERROR = "order O5521 has shipped: it cannot be cancelled"


class ToolFailure(Exception):
    """What `cancel_order` raises."""


def find_customer(email: str) -> str:
    return json.dumps({"customer_id": "C104", "email": email})


def get_order(order_id: str) -> str:
    return json.dumps({"order_id": order_id, "status": "shipped", "total": 42.5})


def cancel_order(order_id: str, reason: str) -> str:
    raise ToolFailure(CANCEL_ERROR)


def track_shipment(order_id: str) -> str:
    return json.dumps({"order_id": order_id, "carrier": "UPS", "status": "in transit"})


TOOLS: dict[str, Callable[..., str]] = {f.__name__: f for f in (find_customer, get_order, cancel_order, track_shipment)}
DESCRIPTIONS = {
    "find_customer": "Look a customer up by e-mail.",
    "get_order": "One order: status, items, total.",
    "cancel_order": "Cancel an order that has not shipped.",
    "track_shipment": "Carrier tracking of a shipped order.",
}

# What `observed` with the `support` spec says of each call, in order: (tool, valid, failed check).
EXPECTED_STEPS = [
    ("find_customer", True, None),
    ("get_order", True, None),
    ("cancel_order", False, "P"),
    ("track_shipment", True, None),
]


def pexec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The `pexec` console script of this environment, in a process that has not imported any producer."""
    script = str(Path(sys.executable).with_name("pexec"))
    proc = subprocess.run([script, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc


def ingest_and_score(fmt: str, source: Path, tmp: Path, *options: str) -> dict[str, list[dict[str, Any]]]:
    """`pexec ingest FMT SOURCE` then `pexec score --env observed --spec support --inline`: rollout id -> its
    steps (rows of the run's `steps` table) in depth order."""
    import pyarrow.parquet as pq

    pexec("ingest", fmt, str(source), "--out", "store", *[a for o in options for a in ("--option", o)], cwd=tmp)
    pexec("score", "store", "--out", "run", "--env", "observed", "--spec", "support", "--inline", cwd=tmp)
    out: dict[str, list[dict[str, Any]]] = {}
    for s in sorted(pq.read_table(tmp / "run" / "steps").to_pylist(), key=lambda s: (s["rollout_id"], s["step"])):
        out.setdefault(s["rollout_id"], []).append(s)
    return out


def score_with_log_definitions(tmp: Path) -> list[dict[str, Any]]:
    """`pexec score` of the store `ingest_and_score` wrote, with `observed` and no spec: S is checked against the
    tool definitions the log recorded. The steps of its one rollout, in depth order."""
    import pyarrow.parquet as pq

    pexec("score", "store", "--out", "run-log", "--env", "observed", "--inline", cwd=tmp)
    return sorted(pq.read_table(tmp / "run-log" / "steps").to_pylist(), key=lambda s: (s["rollout_id"], s["step"]))


def assert_logged_definitions(record: dict[str, Any]) -> None:
    """The tool definitions the producer gave the model arrived as the rollout's `env.tools`: every tool of the
    script, with exactly the arguments its function takes, all required."""
    tools = record["env"]["tools"]
    assert sorted(tools) == sorted(TOOLS)
    for name, schema in tools.items():
        params = sorted(inspect.signature(TOOLS[name]).parameters)
        assert (sorted(schema["properties"]), sorted(schema["required"])) == (params, params), name


def verdicts(steps: list[dict[str, Any]]) -> list[tuple[str, bool, str | None]]:
    """(tool, valid, failed check) of each step, as EXPECTED_STEPS lists them."""
    return [(s["tool"], s["valid"], s["failed_check"]) for s in steps]


def tool_schemas() -> list[dict[str, Any]]:
    """The chat-completions `tools` of the script's tools, from the support spec's own schemas."""
    spec = json.loads((Path(__file__).parents[1] / "specs" / "support" / "tools.json").read_text())
    return [t for t in spec if t["function"]["name"] in TOOLS]


def turn_of(messages: list[dict[str, Any]]) -> int:
    """Which turn of SCRIPT a request is at: the number of assistant messages it already carries."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def unique_id(call: ToolCall, turn: int) -> str:
    """The call's id from a stub that never reuses one (the Agents SDK refuses a reused id)."""
    return f"{call.call_id}_{turn}"


def completion(turn: int, unique: bool = False) -> dict[str, Any]:
    """The chat-completions response for a turn of SCRIPT (FINAL after the last); `unique`: ids as `unique_id`."""
    if turn < len(SCRIPT):
        calls = [
            {"id": unique_id(c, turn) if unique else c.call_id, "type": "function",
             "function": {"name": c.tool, "arguments": json.dumps(c.arguments)}}
            for c in SCRIPT[turn]
        ]  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": FINAL}, "stop"
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": 1_795_953_600 + turn,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 50 + 10 * turn, "completion_tokens": 12, "total_tokens": 62 + 10 * turn},
    }


@dataclass
class Stub:
    base_url: str  # e.g. http://127.0.0.1:PORT/v1
    unique_url: str  # the same, never reusing a call id
    requests: list[dict[str, Any]]


@contextmanager
def stub_server() -> Iterator[Stub]:
    """A chat-completions server on 127.0.0.1 (a free port) answering each request with the SCRIPT turn its
    messages are at (under `/unique/` with ids that are never reused); it keeps the request bodies."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[dict[str, Any]] = []

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        unique = request.url.path.startswith("/unique/")
        return JSONResponse(completion(turn_of(body["messages"]), unique))

    path = "/v1/chat/completions"
    app = Starlette(routes=[Route(p, chat, methods=["POST"]) for p in (path, f"/unique{path}")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the stub server did not start")
        time.sleep(0.01)
    try:
        yield Stub(f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}/unique/v1", seen)
    finally:
        server.should_exit = True
        thread.join(5)


def agent_loop(create: Callable[[list[dict[str, Any]]], Any], run_tool: Callable[[Any, dict[str, Any]], str]) -> None:
    """A plain chat-completions agent: ask the model (`create(messages)`), run each tool call it returns
    (`run_tool(tool_call, arguments)`; a raised ToolFailure is answered with `Error: ...`), until it answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": USER}]
    while True:
        message = create(messages).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for tc in message.tool_calls:
            try:
                content = run_tool(tc, json.loads(tc.function.arguments))
            except ToolFailure as exc:
                content = f"Error: {exc}"
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": content})


def traced_conversation(base_url: str, provider: Any, tool_spans: str, logs: Any = None) -> None:
    """The scripted conversation under the openai-v2 instrumentation (spans to `provider`, log records to `logs`),
    its tools inside `opentelemetry-util-genai` `execute_tool` spans unless `tool_spans` is "no"."""
    from openai import OpenAI
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.util.genai.handler import get_telemetry_handler
    from opentelemetry.util.genai.types import FunctionToolDefinition

    OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logs)
    handler = get_telemetry_handler(tracer_provider=provider, logger_provider=logs)
    client = OpenAI(base_url=base_url, api_key="stub", max_retries=0)

    def run_tool(tc: Any, arguments: dict[str, Any]) -> str:
        if tool_spans == "no":
            return TOOLS[tc.function.name](**arguments)
        with handler.tool(tc.function.name, tool_call_id=tc.id, tool_type="function") as invocation:
            if invocation.should_capture_content_on_span:
                invocation.arguments = arguments
            result = TOOLS[tc.function.name](**arguments)
            if invocation.should_capture_content_on_span:
                invocation.tool_result = result
            return result

    # The agent's span (util-genai's invoke_agent) records the tool definitions the model is given: the
    # openai-v2 chat spans do not.
    with handler.invoke_local_agent(agent_name="support") as agent:
        agent.tool_definitions = [
            FunctionToolDefinition(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in tool_schemas()
        ]
        agent_loop(lambda messages: client.chat.completions.create(model=MODEL, messages=messages,
                                                                   tools=tool_schemas()), run_tool)  # fmt: skip
    provider.shutdown()
    if logs is not None:
        logs.shutdown()


def run_otel(base_url: str, out: str, tool_spans: str = "yes") -> None:
    """The OpenTelemetry GenAI producer, run in a process of its own (the semantic-convention opt-in is read
    once per process): the `openai` SDK under `opentelemetry-instrumentation-openai-v2` makes the chat spans,
    `opentelemetry-util-genai`'s handler the `execute_tool` spans; the spans are written to `out` as OTLP JSON
    by the SDK's own OTLP encoder and protobuf's JSON mapping. Content capture follows
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT; `tool_spans=no`: the instrumented client alone, as
    auto-instrumentation of an application that makes no tool spans of its own."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent", "service.version": "1.5.0"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced_conversation(base_url, provider, tool_spans)
    Path(out).write_text(json.dumps(MessageToDict(encode_spans(exporter.get_finished_spans()))))


def run_otel_files(base_url: str, out_dir: str, tool_spans: str = "yes") -> None:
    """The same producer as `run_otel`, with its log records too (the GenAI events the instrumentation emits
    without the semantic-convention opt-in, or the opt-in's `EVENT_ONLY` details events, as the environment
    says), each export written by the SDK's own OTLP encoders as an exporter writes it: `traces.jsonl` and
    `logs.jsonl` by the OTLP JSON file exporter (one export per line, as the Collector `file` exporter writes
    JSON), `traces.pb` and `logs.pb` by the OTLP protobuf encoder, each message behind its length (4 bytes,
    big-endian, as the `file` exporter writes `format: proto`), and `spans.json`: all spans in today's form
    (`run_otel`'s file). One export per span and per log record (a simple processor)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter
    from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.instrumentation import openai_v2
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    out = Path(out_dir)

    def framed(name: str, message: Any) -> None:
        data = message.SerializeToString()
        with (out / name).open("ab") as f:
            f.write(len(data).to_bytes(4, "big") + data)

    class ProtoSpans(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            framed("traces.pb", encode_spans(spans))
            return SpanExportResult.SUCCESS

    class ProtoLogs(LogRecordExporter):
        def export(self, batch: Any) -> LogRecordExportResult:
            framed("logs.pb", encode_logs(batch))
            return LogRecordExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return True

    resource = Resource.create({"service.name": "support-agent", "service.version": "1.5.0"})
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    for exporter in (memory, FileSpanExporter(out / "traces.jsonl"), ProtoSpans()):
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    logs = LoggerProvider(resource=resource)
    for log_exporter in (FileLogExporter(out / "logs.jsonl"), ProtoLogs()):
        logs.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    if "OTEL_SEMCONV_STABILITY_OPT_IN" not in os.environ:
        # Without the opt-in the instrumentation keeps the v1.30 conventions (content as per-message log events),
        # but util-genai 1.1b0 reports the latest ones as always on: select the instrumentation's own v1.30 path.
        openai_v2.is_experimental_mode = lambda: False
    traced_conversation(base_url, provider, tool_spans, logs)
    (out / "spans.json").write_text(json.dumps(MessageToDict(encode_spans(memory.get_finished_spans()))))


def run_agents(base_url: str, out: str) -> None:
    """The OpenAI Agents SDK producer: an `Agent` on `OpenAIChatCompletionsModel` with `function_tool` tools (a
    raising tool is answered with the SDK's default error text), its tracing off (it would upload); the
    transcript, the run's items as the SDK's own converter turns them into chat-completions messages, is
    written to `out` as one conversation."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.models.chatcmpl_converter import Converter
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    tools = [function_tool(f, name_override=name, description_override=DESCRIPTIONS[name]) for name, f in TOOLS.items()]
    client = AsyncOpenAI(base_url=base_url, api_key="stub", max_retries=0)
    agent = Agent(name="support", instructions="Help the customer.", tools=tools,
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client))  # fmt: skip
    result = Runner.run_sync(agent, USER)
    messages = Converter.items_to_messages(result.to_input_list())
    # The request's `tools`, as the SDK's own converter gives them to the model.
    given = [Converter.tool_to_openai(t) for t in tools]
    Path(out).write_text(json.dumps({"id": "agents-1", "model": MODEL, "messages": messages, "tools": given}))


def run_mlflow(base_url: str, tracking_uri: str, experiment: str) -> None:
    """The MLflow producer: `mlflow.openai.autolog()` traces the `openai` SDK's chat calls, the tools are
    `@mlflow.trace(span_type=TOOL)` functions (the raising one records its exception), all under one AGENT span:
    one trace, logged to the tracking server at `tracking_uri`."""
    import mlflow
    from mlflow.entities import SpanType
    from openai import OpenAI

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    mlflow.openai.autolog()
    client = OpenAI(base_url=base_url, api_key="stub", max_retries=0)
    tools = {name: mlflow.trace(f, name=name, span_type=SpanType.TOOL) for name, f in TOOLS.items()}

    @mlflow.trace(name="support_agent", span_type=SpanType.AGENT)
    def support() -> None:
        agent_loop(lambda messages: client.chat.completions.create(model=MODEL, messages=messages,
                                                                   tools=tool_schemas()),
                   lambda tc, arguments: tools[tc.function.name](**arguments))  # fmt: skip

    support()
    mlflow.flush_trace_async_logging()


def run_phoenix(base_url: str, endpoint: str, project: str) -> None:
    """The Phoenix producer: OpenInference's OpenAI instrumentation traces the `openai` SDK's chat calls, the
    tools are OpenInference TOOL spans (`tracer.tool`), all under one AGENT span; the spans go to the Phoenix
    server's OTLP/HTTP endpoint in project `project`."""
    from openai import OpenAI
    from openinference.instrumentation import TracerProvider
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"openinference.project.name": project}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("support-agent")
    client = OpenAI(base_url=base_url, api_key="stub", max_retries=0)
    tools = {name: tracer.tool(name=name)(f) for name, f in TOOLS.items()}
    with tracer.start_as_current_span("support_agent", openinference_span_kind="agent"):
        agent_loop(lambda messages: client.chat.completions.create(model=MODEL, messages=messages,
                                                                   tools=tool_schemas()),
                   lambda tc, arguments: tools[tc.function.name](**arguments))  # fmt: skip
    provider.shutdown()
    _wait_for_spans(endpoint, project)


PHOENIX_SPANS = 1 + 4 + 4  # what run_phoenix sends: the agent span, four model calls, four tool calls


def _wait_for_spans(endpoint: str, project: str, seconds: float = 60) -> None:
    """Until Phoenix can read back every span sent: it answers the export at once and inserts the spans in the
    background, so a reader that comes right after (the guide's next command) could find no trace."""
    import httpx
    from phoenix.client import Client

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:  # the project itself is made with its first stored span: 404 until then
            if len(Client(base_url=endpoint).spans.get_spans(project_identifier=project, limit=100)) >= PHOENIX_SPANS:
                return
        except (httpx.HTTPStatusError, httpx.TimeoutException):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"phoenix did not store the {PHOENIX_SPANS} spans sent within {seconds:g} s")


def send(target: str, url: str, name: str) -> None:
    """What the MLflow and Phoenix guides run: the scripted agent, its model played by the stub on loopback, traced
    by the real SDK to the server at `url` (MLflow: experiment `name`; Phoenix: project `name`)."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its INFO lines (a new experiment, a flush): noise here
    with stub_server() as stub:
        {"mlflow": run_mlflow, "phoenix": run_phoenix}[target](stub.base_url, url, name)
    where = {"mlflow": "experiment", "phoenix": "project"}[target]
    print(f"sent 1 trace ({len(CALLS)} tool calls) to {target} {where} {name!r}")


if __name__ == "__main__":  # python producers.py otel|otel-files|agents|mlflow|phoenix BASE_URL ...
    # python tests/producers.py send mlflow|phoenix URL EXPERIMENT_OR_PROJECT: the stub model included
    producers = {"otel": run_otel, "otel-files": run_otel_files, "agents": run_agents, "mlflow": run_mlflow,
                 "phoenix": run_phoenix, "send": send}  # fmt: skip
    producers[sys.argv[1]](*sys.argv[2:])
