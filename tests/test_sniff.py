"""Another format's logs given to an adapter: a one-line error naming the likely format, never rollouts with
no calls and exit 0."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.ingest import IngestError, IngestOptions, ingest

ANTHROPIC = {"id": "a", "messages": [
    {"role": "user", "content": "find order O1"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_order", "input": {"id": "O1"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "shipped"}]},
]}  # fmt: skip
OPENAI = {"id": "o", "messages": [
    {"role": "user", "content": "find order O1"},
    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "get_order", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": "shipped"},
]}  # fmt: skip
CHAT_ONLY = {"id": "q", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def write(tmp_path: Path, name: str, *docs: Any) -> str:
    path = tmp_path / name
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return str(path)


@pytest.mark.parametrize(
    ("fmt", "doc", "said"),
    [
        ("openai", ANTHROPIC, "not in the openai format (it looks like anthropic logs: pexec ingest anthropic)"),
        ("anthropic", OPENAI, "not in the anthropic format (it looks like openai logs: pexec ingest openai)"),
        (
            "otel",
            OPENAI,
            "not an OTLP JSON export (no 'resourceSpans' or 'resourceLogs' list) (it looks like openai logs",
        ),
        ("openai", {"resourceSpans": []}, "'messages' list (it looks like otel logs: pexec ingest otel)"),
    ],
)
def test_another_formats_logs_are_named(tmp_path: Path, fmt: str, doc: dict, said: str) -> None:
    source = write(tmp_path, "logs.jsonl", doc)
    with pytest.raises(IngestError, match=re.escape(said)):
        list(ingest(fmt, [source]))


def test_tau2_names_the_likely_format(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_bytes(orjson.dumps({"resourceSpans": []}))
    with pytest.raises(IngestError, match=r"no 'simulations' list\) \(it looks like otel logs"):
        list(ingest("tau2", [str(tmp_path / "r.json")]))


def test_logs_without_a_single_call_need_the_opt_in(tmp_path: Path) -> None:
    source = write(tmp_path, "logs.jsonl", CHAT_ONLY, CHAT_ONLY | {"id": "r"})
    with pytest.raises(IngestError, match=r"openai: 2 rollout\(s\) and not one tool call: .*allow_no_calls=true"):
        list(ingest("openai", [source]))
    allowed = list(ingest("openai", [source], IngestOptions(extra={"allow_no_calls": "true"})))
    assert [r["rollout_id"] for r in allowed] == ["q", "r"]
    with pytest.raises(IngestError, match="allow_no_calls takes true or false"):
        list(ingest("openai", [source], IngestOptions(extra={"allow_no_calls": "maybe"})))
    # Rollouts without calls before the first one with a call are kept, in order.
    mixed = write(tmp_path, "mixed.jsonl", CHAT_ONLY, OPENAI, CHAT_ONLY | {"id": "r"})
    assert [r["rollout_id"] for r in ingest("openai", [mixed])] == ["q", "o", "r"]


def test_a_bfcl_result_file_given_without_its_format_is_named(tmp_path: Path) -> None:
    """The shared real BFCL results scored as if a canonical store: one line naming bfcl, not every entry rejected
    for a missing rollout_id."""
    from typer.testing import CliRunner

    from pipeline.apps.cli import app

    result = (
        Path(__file__).resolve().parents[2] / "shared/data/real/bfcl/gpt-oss-120b/BFCL_v4_multi_turn_base_result.json"
    )
    done = CliRunner().invoke(app, ["score", str(result), "--out", str(tmp_path / "run"), "--inline"])
    assert done.exit_code == 2, done.output
    assert done.output.startswith("error: these look like bfcl logs: add --format bfcl")
    assert not (tmp_path / "run").exists()
