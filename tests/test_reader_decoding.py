"""Every reader answers for any value in any place: a valid log of each format (openai, anthropic, otel, canonical,
bfcl and tau2 with the shared real logs; inspect and toolsandbox are not fed here) with one value replaced by a hostile
number (past float range, past Python's digit limit) or nesting (around the record limit, orjson's and the
interpreter's recursion limits), in the document itself or in JSON text the document carries, is read into
records or stops with an IngestError naming the place (a counted reject when scored), never another exception.
`make fuzz` runs many more examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ingest_chat import ANTHROPIC, OPENAI
from test_ingest_otel import CHAT, export, span, tool

from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.synthetic.rollouts import synthesize

BFCL = Path(__file__).resolve().parent / "data" / "bfcl" / "DeepSeek-V3-0324-FC"
_SENTINEL = "@@hostile@@"

NUMBERS = ["1" + "0" * n for n in (19, 20, 308, 309, 400, 4300, 4301, 5000)]
NUMBERS += ["-1" + "0" * 5000, "1e999999", "-1e999999", "1e-999999", "0." + "0" * 5000 + "1", "1" * 5000 + ".5"]
NESTING = [
    open_ * n + close * n
    for n in (63, 64, 65, 254, 255, 1023, 1024, 1025, 5000, 100_000)
    for open_, close in (("[", "]"), ('{"a":', "}"))
]
NESTING = [t.replace("[]", "[1]").replace(":}", ":1}") for t in NESTING]
HOSTILE = NUMBERS + NESTING


def bfcl_entry() -> dict[str, Any]:
    [source] = BFCL.glob("*_result.json")
    entry: dict[str, Any] = orjson.loads(source.read_bytes().splitlines()[0])
    return entry


def otel_export() -> dict[str, Any]:
    return export(span("t1", "s1", "chat", 0, **CHAT), tool("t1", "s2", 10, "find_customer", "c1"))


# (format, file name, valid document, how documents are written: one per line or one per file)
FORMATS: list[tuple[str, str, Any, bool]] = [
    ("openai", "a.jsonl", OPENAI, True),
    ("anthropic", "a.jsonl", ANTHROPIC, True),
    ("otel", "a.json", otel_export(), False),
    ("canonical", "a.jsonl", next(iter(synthesize("shop", 1, 1, 3))), True),
]
if BFCL.is_dir():
    FORMATS.append(("bfcl", "m/BFCL_v3_multi_turn_base_result.json", bfcl_entry(), True))
TAU2 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real" / "tau2" / "airline_gpt-4o.json"
if TAU2.is_file():
    results = orjson.loads(TAU2.read_bytes())
    simulation = results["simulations"][0]
    tasks = [t for t in results["tasks"] if t["id"] == simulation["task_id"]]
    FORMATS.append(("tau2", "airline_gpt-4o.json", {**results, "tasks": tasks, "simulations": [simulation]}, False))


def places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in `value` a value sits (the root excluded)."""
    found = [path] if path else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        found += places(item, (*path, key))
    return found


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


def hostile_text(doc: Any, place: int, text: str, as_string: bool) -> bytes:
    """`doc` as JSON with the value at its `place`-th place replaced by `text`: as JSON itself, or (`as_string`)
    inside a string, where a reader that decodes the JSON text a log carries (arguments, outputs) meets it."""
    where = places(doc)[place % len(places(doc))]
    if as_string:
        return orjson.dumps(replaced(doc, where, text))
    return orjson.dumps(replaced(doc, where, _SENTINEL)).replace(f'"{_SENTINEL}"'.encode(), text.encode())


def read_all(tmp: Path, fmt: str, name: str, content: bytes, per_line: bool) -> list[dict[str, Any]]:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content + b"\n" if per_line else content)
    source = str(path.parent if fmt == "bfcl" else path)
    options = IngestOptions(extra={"allow_no_calls": "true"})
    try:
        return list(ingest(fmt, [source], options))
    except IngestError as exc:  # the reader's one line naming the place: a counted reject when scored
        assert "\n" not in str(exc).strip()
        return []


@pytest.mark.parametrize(("fmt", "name", "doc", "per_line"), FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("text", HOSTILE, ids=[f"{t[:6]}..{len(t)}" for t in HOSTILE])
def test_a_hostile_value_in_the_first_place_of_each_kind(tmp_path, fmt, name, doc, per_line, text):
    for as_string in (False, True):
        read_all(tmp_path, fmt, name, hostile_text(doc, 0, text, as_string), per_line)


@pytest.mark.fuzz
@pytest.mark.parametrize(("fmt", "name", "doc", "per_line"), FORMATS, ids=[f[0] for f in FORMATS])
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.integers(0, 10_000), text=st.sampled_from(HOSTILE), as_string=st.booleans())
def test_a_hostile_value_anywhere(tmp_path, fmt, name, doc, per_line, place, text, as_string):
    read_all(tmp_path, fmt, name, hostile_text(doc, place, text, as_string), per_line)


@pytest.mark.parametrize(("fmt", "name", "doc", "per_line"), FORMATS, ids=[f[0] for f in FORMATS])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.integers(0, 10_000), text=st.sampled_from(HOSTILE), as_string=st.booleans())
def test_a_hostile_value_somewhere(tmp_path, fmt, name, doc, per_line, place, text, as_string):
    read_all(tmp_path, fmt, name, hostile_text(doc, place, text, as_string), per_line)


def test_a_label_nested_past_what_json_text_can_hold_is_a_one_line_error(tmp_path: Path) -> None:
    # Found by the fuzz test above: a span's model attribute 300 lists deep reached the label's JSON text, and
    # orjson's TypeError left ingest() instead of the reader's error naming the place.
    _, name, doc, _ = next(f for f in FORMATS if f[0] == "otel")
    path = tmp_path / name
    path.write_bytes(hostile_text(doc, 31, "[" * 300 + "1" + "]" * 300, as_string=False))
    with pytest.raises(IngestError, match="a label or attribute value cannot be written as JSON text") as raised:
        list(ingest("otel", [str(path)], IngestOptions(extra={"allow_no_calls": "true"})))
    assert "\n" not in str(raised.value).strip()
