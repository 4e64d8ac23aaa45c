"""Adversarial input through the real scorer: no record can stop a run or go missing.

Random and hostile records — deep nesting, huge strings, NaN, control characters and markup, wrong types in
every field, broken JSON — are mixed with real synthetic rollouts and scored through `run_scoring`. Every
run must finish with a manifest, and every line must be accounted for: read = scored + rejected, with the
rollouts and rejects tables holding exactly those rows. `make fuzz` runs the same properties with many more
examples (PEXEC_FUZZ_EXAMPLES) for a bounded time.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import InvalidRecord
from pipeline.core.records import parse_rollout
from pipeline.core.run_folder import Manifest
from pipeline.expr import BudgetExceeded, EvalError, ExprError, compile_expr
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.synthetic.rollouts import synthesize

EXAMPLES = examples(25)
BASE = list(synthesize("shop", 12, 6, 3))
DEEP = re.compile(r'"@@deep(\d+)@@"')  # placeholder for a value nested n levels, spliced in as text
HOSTILE_TEXT = ["[/x]", "[bold]red[/bold]", "\x1b[31mred\x1b[0m", "a\rb\x07\x08c", "\u202eevil", "null", ""]


def deep_text(n: int, leaf: str = "1") -> str:
    return '{"a":' * n + leaf + "}" * n


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.sampled_from(HOSTILE_TEXT),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
hostile = st.one_of(
    json_values,
    st.integers(1, 1100).map(lambda n: f"@@deep{n}@@"),  # around our limit (64) and orjson's (255, 1024)
    st.integers(0, 300_000).map(lambda n: "x" * n),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 10**30, -(2**63), 2**64]),
)
# Every place a value can sit in a canonical record (docs/explanation/data-model.md, "Canonical rollout"): (part, key).
FIELDS = [
    *(("record", k) for k in ("rollout_id", "task_id", "benchmark", "success", "labels", "cost", "env", "truth")),
    ("record", "events"),
    *(("labels", k) for k in ("model", "[/x]", "T", "")),
    ("cost", "tokens"),
    ("env", "state"),
    *(("message", k) for k in ("content", "role", "type", "turn")),
    *(("call", k) for k in ("type", "tool", "arguments", "output", "error", "turn", "call_id")),
]


@st.composite
def records(draw: st.DrawFn) -> str:
    """One line of a JSON Lines store: a real rollout with some fields replaced, or broken text."""
    if draw(st.integers(0, 9)) == 0:
        TALLY["broken_lines"] += 1
        return draw(st.sampled_from(["{", "[1, 2]", '"text"', '{"rollout_id": NaN}', "\x00\x01", "{}" * 3]))
    record = json.loads(json.dumps(draw(st.sampled_from(BASE))))
    record["rollout_id"] = f"{record['rollout_id']}-{draw(st.integers(0, 10**9))}"  # shards refuse duplicates
    for _ in range(draw(st.integers(0, 3))):
        part, key = draw(st.sampled_from(FIELDS))
        target = _part(record, part)
        if isinstance(target, dict):
            target[key] = draw(hostile)
            TALLY["hostile_values"] += 1
    line = json.dumps(record, allow_nan=True)  # NaN and Infinity make the line invalid JSON: a reject
    return DEEP.sub(lambda m: deep_text(int(m[1])), line)


def _part(record: dict[str, Any], part: str) -> Any:
    if part == "record":
        return record
    if part in ("message", "call"):
        events = record.get("events")
        kind = [e for e in events if isinstance(e, dict) and e.get("type") == part] if isinstance(events, list) else []
        return kind[0] if kind else None
    return record.get(part)


TALLY: dict[str, Any] = {"runs": 0, "records": 0, "scored": 0, "rejected": 0, "lost": 0}
TALLY |= {"broken_lines": 0, "hostile_values": 0}  # generated (hypothesis may discard a few)
TALLY |= {"expressions": 0, "expr_refused": 0, "expr_over_budget": 0, "expr_slowest_s": 0.0}


@pytest.fixture(scope="module", autouse=True)
def tally() -> Any:
    """Prints what the module tried (shown with `pytest -s`, as `make fuzz` runs it; docs/reference/limits.md,
    "Hardening")."""
    yield
    print(f"\n[fuzz] {TALLY}")


def score_lines(lines: list[str], folder: Path, executor: str = "inline") -> tuple[Manifest, int, int]:
    store, run = folder / "store", folder / "run"
    store.mkdir(parents=True)
    for i in range(0, len(lines), 7):  # several files, so several shards
        (store / f"part-{i:03d}.jsonl").write_text("".join(line + "\n" for line in lines[i : i + 7]))
    manifest = run_scoring(str(store), str(run), ScoreSettings(inline=executor == "inline"))
    assert (run / "_manifest.json").exists()
    con = duckdb.connect()
    rollouts = con.sql(f"SELECT count(*) FROM read_parquet('{run}/rollouts/*.parquet')").fetchall()[0][0]
    rejects = con.sql(f"SELECT count(*) FROM read_parquet('{run}/rejects/*.parquet')").fetchall()[0][0]
    return manifest, rollouts, rejects


def assert_nothing_lost(lines: list[str], manifest: Manifest, rollouts: int, rejects: int) -> None:
    counts = manifest.counts
    records_in = sum(1 for line in lines if line.strip())  # blank lines are not records
    TALLY["runs"] += 1
    TALLY["records"] += records_in
    TALLY["scored"] += rollouts
    TALLY["rejected"] += rejects
    TALLY["lost"] += records_in - rollouts - rejects
    assert counts.read == records_in
    assert counts.read == counts.scored + counts.rejected
    assert (rollouts, rejects) == (counts.scored, counts.rejected)


@pytest.mark.fuzz
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(lines=st.lists(records(), min_size=1, max_size=20))
def test_no_record_stops_a_run_or_goes_missing(lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("fuzz")
    manifest, rollouts, rejects = score_lines(lines, folder)
    assert_nothing_lost(lines, manifest, rollouts, rejects)


# The measured failures, by hand: each is rejected with its reason (or scored), and the others are scored.
NAMED = {
    "labels 255 deep": ("labels", deep_text(255, '"x"'), "the record nests deeper than 64 levels"),
    "env 255 deep": ("env", deep_text(255), "the record nests deeper than 64 levels"),
    "cost 1000 deep": ("cost", deep_text(1000), "the record nests deeper than 64 levels"),
    "cost NaN": ("cost", '{"tokens": NaN}', "invalid JSON"),
    "cost overflowing": ("cost", '{"tokens": 1e400}', "number is infinity"),
    "label clashing in another case": ("labels", '{"Fed": "x"}', "label 'Fed' clashes with an output column"),
    "labels not an object": ("labels", "[1]", "'labels' must be an object"),
    "success a string": ("success", '"yes"', "'success' must be true, false or null"),
}


def _with(field: str, value_text: str, n: int) -> str:
    record = dict(BASE[n % len(BASE)], rollout_id=f"named-{n}")
    record.pop(field, None)
    return json.dumps(record)[:-1] + f', "{field}": {value_text}}}'


@pytest.mark.fuzz
def test_measured_failures_are_rejects_with_their_reason(tmp_path: Path) -> None:
    good = [json.dumps(r) for r in BASE[:3]]
    named = [_with(field, text, i) for i, (field, text, _) in enumerate(NAMED.values())]
    args = dict(BASE[3], rollout_id="deep-args")
    args["events"] = [*args["events"], {"type": "call", "tool": "get_order", "arguments": "[" * 900 + "]" * 900}]
    manifest, rollouts, rejects = score_lines([*good, *named, json.dumps(args)], tmp_path)
    assert rejects == manifest.counts.rejected == len(NAMED) and rollouts == 4
    query = f"SELECT reason FROM read_parquet('{tmp_path}/run/rejects/*.parquet')"
    reasons = [r for (r,) in duckdb.sql(query).fetchall()]
    for _, _, expected in NAMED.values():
        assert any(expected in reason for reason in reasons), (expected, reasons)
    detail = duckdb.sql(
        f"SELECT detail FROM read_parquet('{tmp_path}/run/steps/*.parquet') WHERE rollout_id = 'deep-args' "
        "ORDER BY step DESC LIMIT 1"
    ).fetchall()[0][0]
    assert detail == "arguments nest deeper than 64 levels"


@pytest.mark.fuzz
@pytest.mark.usefixtures("shared_ray")
def test_adversarial_records_through_ray(tmp_path: Path) -> None:
    rng = random.Random(7)
    lines = [json.dumps(r) for r in BASE[:4]]
    lines += [_with(field, text, 100 + i) for i, (field, text, _) in enumerate(NAMED.values())]
    lines += ['{"rollout_id": "x"', "", rng.choice(HOSTILE_TEXT)]
    manifest, rollouts, rejects = score_lines(lines, tmp_path, executor="ray")
    assert_nothing_lost(lines, manifest, rollouts, rejects)
    assert rollouts == 4


@pytest.mark.fuzz
@pytest.mark.parametrize(
    ("cost", "reason"),
    [
        ({"tokens": float("nan")}, "cost 'tokens' must be a finite number, got nan"),  # Parquet carries NaN
        ({"tokens": float("inf")}, "cost 'tokens' must be a finite number, got inf"),
        ({"tokens": 10**400}, "cost 'tokens' is an integer beyond any float"),
    ],
)
def test_costs_are_finite(cost: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidRecord, match=re.escape(reason)):
        parse_rollout(dict(BASE[0], cost=cost))


# ---- expressions: any expression over any data ends with a value or a reason ----

leaves = st.sampled_from(["args.s", "args.n", "args.l", "state", "x", "'ab'", "2", "10**3", "[1, 2]", "{'k': 1}"])


def _grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(inner, st.sampled_from(["+", "*", "-", "//", "%", "==", "in", "and"]), inner)
    return st.one_of(
        binary.map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["len", "str", "sorted", "unique", "sum", "max", "keys"]), inner).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
        st.tuples(inner, inner).map(lambda t: f"[{t[0]} for x in {t[1]}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"[{t[0]} for x in {t[1]} for y in {t[2]}]"),
        st.tuples(inner, inner).map(lambda t: f"concat({t[0]}, {t[1]})"),
        inner.map(lambda t: f"matches({t}, '(a+)+$')"),
        inner.map(lambda t: f"{t}[1:]"),
    )


expressions = st.recursive(leaves, _grow, max_leaves=10)
contexts = st.fixed_dictionaries(
    {
        "s": st.sampled_from(["", "a" * 29 + "!", "[/x]" * 1000, "x" * 100_000]),
        "n": st.sampled_from([0, -1, 2**62, 10**300]),
        "l": st.sampled_from([[], list(range(1000)), [[1]] * 500, ["a" * 1000] * 300]),
    }
)


@pytest.mark.fuzz
@settings(max_examples=EXAMPLES * 8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions, args=contexts)
def test_every_expression_ends_with_a_value_or_a_reason(source: str, args: dict[str, Any]) -> None:
    TALLY["expressions"] += 1
    try:
        expr = compile_expr(source, {"args", "state"})
    except ExprError:
        TALLY["expr_refused"] += 1
        return  # refused at load (size, nesting, a name that is not allowed): a reason
    ctx = {"args": args, "state": {"k": list(range(50))}}
    began = time.perf_counter()
    try:
        expr(ctx)
    except BudgetExceeded as exc:
        TALLY["expr_over_budget"] += 1
        assert str(exc).startswith("evaluation budget exceeded: ") and "evaluating: " in str(exc)
    except EvalError as exc:
        assert str(exc)  # a stated reason (type error, missing key, division by zero, ...)
    finally:
        TALLY["expr_slowest_s"] = round(max(TALLY["expr_slowest_s"], time.perf_counter() - began), 2)


@pytest.mark.fuzz
def test_parquet_columns_of_unexpected_types(tmp_path: Path) -> None:
    """Parquet carries types JSON cannot: NaN, timestamps, bytes, structs. Each file has one odd column."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    events = [
        {"type": "message", "role": "user", "content": "hi", "turn": 0},
        {"type": "call", "tool": "list_products", "arguments": "{}", "output": "[]", "turn": 0},
    ]
    base = {"task_id": "t", "benchmark": "shop", "labels": {"model": "m"}, "events": events, "success": True}
    variants = {
        "nan_cost": {"cost": {"tokens": float("nan")}},
        "timestamp_id": {"rollout_id": datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC)},
        "int_success": {"success": 1},
        "bytes_arguments": {"events": [{"type": "call", "tool": "list_products", "arguments": b"\xff\x00"}]},
        "struct_labels": {"labels": {"model": 7, "[/x]": "\x1b[2J"}},
        "list_env": {"env": [1, 2]},
        "float_turn": {"events": [{"type": "message", "role": "user", "content": "hi", "turn": 1.5}]},
        "huge_text": {"events": [{"type": "message", "role": "user", "content": "x" * 3_000_000}]},
    }
    store = tmp_path / "store"
    store.mkdir()
    pq.write_table(pa.Table.from_pylist([dict(base, rollout_id="ok")]), store / "ok.parquet")
    for name, change in variants.items():  # Arrow types a column by all its rows: one file per variant
        row = dict(base, rollout_id=name) | change
        pq.write_table(pa.Table.from_pylist([row]), store / f"{name}.parquet")
    manifest = run_scoring(str(store), str(tmp_path / "run"), ScoreSettings(inline=True))
    assert manifest.counts.read == 1 + len(variants) and manifest.counts.scored >= 1
    assert manifest.counts.read == manifest.counts.scored + manifest.counts.rejected
    reasons = dict(
        duckdb.sql(f"SELECT source, reason FROM read_parquet('{tmp_path}/run/rejects/*.parquet')").fetchall()
    )
    assert any("must be a finite number" in r for r in reasons.values())
    assert any("'success' must be true, false or null" in r for r in reasons.values())


@pytest.mark.fuzz
def test_a_result_that_cannot_be_written_is_a_reject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fault no real input is known to cause (so it is injected): converting one result to Arrow fails.
    # That result becomes a reject with the reason; the others of the shard are written.
    import pipeline.scoring.shard

    real = pipeline.scoring.shard.rollouts_table

    def failing(run_id: str, results: list) -> Any:
        if any(r.rollout.rollout_id == BASE[1]["rollout_id"] for r in results):
            raise ValueError("injected conversion failure")
        return real(run_id, results)

    monkeypatch.setattr(pipeline.scoring.shard, "rollouts_table", failing)
    lines = [json.dumps(r) for r in BASE[:5]]
    manifest, rollouts, rejects = score_lines(lines, tmp_path)
    assert_nothing_lost(lines, manifest, rollouts, rejects)
    assert (rollouts, rejects) == (4, 1)
    (reason,) = duckdb.sql(f"SELECT reason FROM read_parquet('{tmp_path}/run/rejects/*.parquet')").fetchall()[0]
    assert reason == "its result cannot be written: ValueError: injected conversion failure"
