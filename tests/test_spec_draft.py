"""`pexec spec draft` measured against truth: synthetic production logs whose hand-written spec is known (`support`:
OpenAI chat logs from pipeline.synthetic.support_logs; `shop`: `pexec synth` rollouts with the spec's definitions
logged), drafted, and the draft compared with the hand spec — its grounded parameters, the S and D of every step
scored with each (the draft's rules are commented out, so P is the log's), and the rule candidates it mines. Then the
draft's own guarantees: evidence merged from shards equals the evidence of the whole, the draft loads where a spec
does, and what it cannot draft from is a one-line refusal."""

from __future__ import annotations

import itertools
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.apps.drafting import DraftSettings, Evidence, draft, observe
from pipeline.apps.drafting.evidence import SKETCH, PathCount, estimate
from pipeline.apps.drafting.proposal import grounded, rules
from pipeline.apps.guard.replay import replay_traffic
from pipeline.core.errors import DraftError
from pipeline.core.model import Call, Message, Rollout
from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.envs.spec.loader import find_spec, load_spec, load_tools_json
from pipeline.ingest import IngestOptions, ingest
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize
from pipeline.synthetic.support_logs import write_samples

SUPPORT_READING = ScoreSettings(format="openai", options={"error_prefix": "Error:"})


def truth(spec: str) -> set[tuple[str, str]]:
    """(tool, path) of every grounded parameter of a hand-written spec (`x[]` read as `x`: the same values)."""
    loaded = load_spec(find_spec(spec))  # type: ignore[arg-type]
    return {(t, p.removesuffix("[]")) for t, r in loaded.tools.items() for p in r.info.grounded}


def proposed(folder: Path) -> set[tuple[str, str]]:
    raw = tomllib.loads((folder / "spec.toml").read_text())
    return {(t, p) for t, table in raw["tool"].items() for p in table.get("grounded", [])}


def s_and_d_agreement(store: str, spec: str, draft_folder: Path, tmp: Path, reading: ScoreSettings) -> tuple[int, int]:
    """(steps, steps whose S/D verdict — S, D or neither — is the same scored with the hand spec and the draft)."""
    for name, with_spec in (("hand", spec), ("draft", str(draft_folder))):
        settings = ScoreSettings(env="observed", spec=with_spec, inline=True, format=reading.format,
                                 options=reading.options)  # fmt: skip
        run_scoring(store, str(tmp / name), settings)
    sd = "CASE WHEN {0}.failed_check IN ('S', 'D') THEN {0}.failed_check END"
    [(n, same)] = duckdb.sql(
        f"SELECT count(*), sum(({sd.format('a')} IS NOT DISTINCT FROM {sd.format('b')})::INT) "
        f"FROM '{tmp}/hand/steps/*.parquet' a JOIN '{tmp}/draft/steps/*.parquet' b USING (rollout_id, step)"
    ).fetchall()
    return n, same


@pytest.fixture(scope="module")
def support(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("support")
    write_samples(root / "logs", per_date=200, seed=0, tools=True)  # 600 conversations, their tools logged
    made = draft([str(root / "logs")], str(root / "draft"), SUPPORT_READING, inline=True)
    assert (made.read, made.rejected, made.evidence.rollouts) == (600, 0, 600)
    return root / "logs", root / "draft"


def precision_and_recall(hand: set[tuple[str, str]], got: set[tuple[str, str]]) -> tuple[float, float]:
    return len(hand & got) / len(got), len(hand & got) / len(hand)


def test_support_grounded_parameters_against_the_hand_spec(support):
    _, folder = support
    hand, got = truth("support"), proposed(folder)
    precision, recall = precision_and_recall(hand, got)
    assert precision >= 0.95 and recall >= 0.95  # the targets, at the default thresholds
    assert got == hand and len(hand) == 11
    # what the user types about themselves, copied in every call that did not fail, is shown and not proposed: the
    # e-mail (each in about one task: the user's own say-so) and the new address's zip (one value: a constant)
    text = (folder / "spec.toml").read_text()
    email = next(ln for ln in text.splitlines() if ln.startswith("#   email:"))
    assert "100% of those only in messages" in email and "what users say about themselves" in email
    zip_line = next(ln for ln in text.splitlines() if ln.startswith("#   address.zip:"))
    assert "1 distinct: one value in 100% of calls: a constant" in zip_line


def test_support_steps_scored_with_the_draft_agree_with_the_hand_spec_on_s_and_d(support, tmp_path):
    logs, folder = support
    assert s_and_d_agreement(str(logs), "support", folder, tmp_path, SUPPORT_READING) == (2924, 2924)


def test_support_mining_recovers_the_cancellation_rule_and_leaves_it_off(support):
    _, folder = support
    text = (folder / "spec.toml").read_text()
    raw = tomllib.loads(text)
    assert all("observed" not in table for table in raw["tool"].values())  # nothing mined is enabled
    line = next(ln for ln in text.splitlines() if "seen.get_order.status != 'shipped'" in ln)
    assert line.startswith('#   { require = "seen.get_order.order_id != args.order_id or ')
    assert line.endswith("# support 10, precision 1.00")


def test_the_draft_loads_as_a_spec_and_guard_replay_runs_it(support):
    logs, folder = support
    spec = load_spec(folder)
    assert spec.version == "0.0.0-draft" and len(spec.tools) == 13
    env = get_environment("observed", EnvOptions(spec=str(folder)))
    assert env.version.startswith("observed+draft@0.0.0-draft+")
    header = (folder / "spec.toml").read_text().splitlines()[:6]
    assert "window: 2026-11-27 to 2026-11-29; 600 rollouts, 2924 calls" in header[2]
    assert header[3].startswith("# thresholds: grounded when a value occurred earlier") and "pexec" in header[4]
    rollouts = [
        parse_rollout(r) for r in ingest("openai", [str(logs)], IngestOptions(extra={"error_prefix": "Error:"}))
    ]
    report = replay_traffic(iter(rollouts), str(folder), None, ())
    assert report.totals()["refused"] > 0


def test_tools_json_keeps_the_definitions_the_logs_recorded(support):
    _, folder = support
    drafted = orjson.loads((folder / "tools.json").read_bytes())
    hand = load_tools_json(find_spec("support") / "tools.json")  # type: ignore[operator]
    called = {t["function"]["name"] for t in drafted}
    assert {n: hand[n] for n in called} == {t["function"]["name"]: t["function"]["parameters"] for t in drafted}
    assert all(t["seen"]["versions"] == 1 for t in drafted)


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> tuple[Path, Path]:
    """`pexec synth shop` rollouts as a production logger would keep them: each with the tool definitions the
    agent was given (the shop spec's), no truth."""
    root = tmp_path_factory.mktemp("shop")
    tools = load_tools_json(find_spec("shop") / "tools.json")  # type: ignore[operator]

    def logged(r: dict[str, Any]) -> dict[str, Any]:
        return {**{k: v for k, v in r.items() if k != "truth"}, "env": {**(r.get("env") or {}), "tools": tools}}

    write_store((logged(dict(r)) for r in synthesize("shop", 2000, 200, seed=1)), str(root / "store"))
    draft([str(root / "store")], str(root / "draft"), ScoreSettings(), inline=True)
    return root / "store", root / "draft"


def test_shop_grounded_parameters_against_the_hand_spec(shop):
    _, folder = shop
    hand, got = truth("shop"), proposed(folder)
    precision, recall = precision_and_recall(hand, got)
    assert precision >= 0.95 and recall >= 0.95  # the targets, at the default thresholds
    assert got == hand and len(hand) == 14
    # the credentials and coupon codes users type are values the shop holds, each used by many tasks: proposed
    text = (folder / "spec.toml").read_text()
    code = next(ln for ln in text.splitlines() if ln.startswith("#   code:"))
    assert "3 distinct: proposed: occurred only in messages" in code


def test_shop_s_and_d_agreement(shop, tmp_path):
    store, folder = shop
    n, same = s_and_d_agreement(str(store), "shop", folder, tmp_path, ScoreSettings())
    assert same / n >= 0.99  # the target
    assert (n, same) == (19106, 19106)
    assert "lookup_order" in (folder / "spec.toml").read_text().split("[tool.")[0]  # called, never defined


def test_evidence_merged_from_parts_equals_the_evidence_of_the_whole(support):
    logs, _ = support
    rollouts = [
        parse_rollout(r) for r in ingest("openai", [str(logs)], IngestOptions(extra={"error_prefix": "Error:"}))
    ]
    whole = observe(rollouts)
    merged = Evidence()
    for i in range(0, len(rollouts), 97):
        merged.merge(observe(rollouts[i : i + 97]))
    assert merged == whole
    s = DraftSettings()
    assert [grounded(t, s) for t in merged.tools.values()] == [grounded(t, s) for t in whole.tools.values()]
    assert [rules(t, s) for t in merged.tools.values()] == [rules(t, s) for t in whole.tools.values()]


def test_what_cannot_be_drafted_is_refused_on_one_line(support, tmp_path):
    logs, folder = support
    with pytest.raises(DraftError, match="exists and is not empty"):
        draft([str(logs)], str(folder), SUPPORT_READING, inline=True)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DraftError, match="nothing to draft from"):
        draft([str(empty)], str(tmp_path / "d1"), ScoreSettings(format="openai"), inline=True)
    with pytest.raises(DraftError, match="nothing to draft from"):  # shuffled, staged in the folder, then removed
        draft([str(empty)], str(tmp_path / "d2"), ScoreSettings(format="otel"), inline=True)
    for fmt in ("mlflow", "phoenix"):  # trace servers: ingest to a store first
        with pytest.raises(DraftError, match=rf"^{fmt} is read from a server.*`pexec ingest {fmt} … --out STORE`"):
            draft(["http://127.0.0.1:9"], str(tmp_path / "d3"), ScoreSettings(format=fmt), inline=True)
    assert not any((tmp_path / d).exists() for d in ("d1", "d2", "d3"))


@pytest.mark.parametrize("encoding", ["proto", "json"])
def test_otlp_spans_are_drafted_directly_as_score_shuffles_them(tmp_path, encoding):
    """OTLP files whose conversations' spans lie in several files (the SDK's own encoder for protobuf) are shuffled
    as `score` shuffles them, in the draft folder's staging area, and drafted: the same grounded set as the hand
    spec, the staging gone."""
    from pipeline.synthetic.support_spans import write_spans

    write_spans(tmp_path / "spans", 600, files=3, encoding=encoding)
    folder = tmp_path / "draft"
    made = draft([str(tmp_path / "spans")], str(folder), ScoreSettings(format="otel"), inline=True)
    assert (made.rejected, made.evidence.rollouts, made.evidence.calls) == (0, 600, 2889)
    assert proposed(folder) == truth("support")
    assert sorted(p.name for p in folder.iterdir()) == ["initial_state.json", "spec.toml", "tools.json"]


@pytest.mark.ray
def test_otlp_spans_drafted_on_ray_from_a_relative_folder(tmp_path, monkeypatch):
    """On Ray the shuffle's rounds run in workers that work elsewhere: the staging area is named absolutely."""
    from pipeline.synthetic.support_spans import write_spans

    write_spans(tmp_path / "spans", 600, files=3, encoding="proto")
    monkeypatch.chdir(tmp_path)
    made = draft(["spans"], "draft", ScoreSettings(format="otel", shard_mb=0.05), num_cpus=2)
    assert (made.rejected, made.evidence.rollouts, made.evidence.calls) == (0, 600, 2889)
    assert made.shards > 1 and proposed(tmp_path / "draft") == truth("support")
    assert not (tmp_path / "draft" / "_staging").exists()


@given(
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=400),
    st.lists(st.integers(0, 400), max_size=6),
    st.randoms(use_true_random=False),
)
@settings(max_examples=60, deadline=None)
def test_a_paths_sketches_merged_in_any_order_equal_the_sketches_of_the_whole(calls, cuts, rnd):
    """Distinct values with their counts, and (task, value) pairs: the k smallest hashes of a union are the k smallest
    of the parts' k smallest, so the merged evidence is exact whatever the shards and their order."""
    whole = PathCount()
    for value, task in calls:
        whole.add(f"V{value}", f"t{task}", True, False, True)
    bounds = sorted({0, len(calls), *(c % (len(calls) + 1) for c in cuts)})
    parts = []
    for a, b in itertools.pairwise(bounds):
        part = PathCount()
        for value, task in calls[a:b]:
            part.add(f"V{value}", f"t{task}", True, False, True)
        parts.append(part)
    rnd.shuffle(parts)
    merged = PathCount()
    for part in parts:
        merged.merge(part)
    assert merged == whole
    distinct, pairs = {v for v, _ in calls}, set(calls)
    assert len(whole.distinct) == min(len(distinct), SKETCH) and len(whole.pairs) == min(len(pairs), SKETCH)
    if len(distinct) < SKETCH:  # exact below the sketch's size: the counts too
        assert estimate(whole.distinct) == len(distinct)
        assert sorted(whole.distinct.values()) == sorted(Counter(v for v, _ in calls).values())


def _conversation(i: int, said: str, returned: str) -> Rollout:
    """A user states `said`; a look-up returns `returned`; the agent passes both on."""
    return Rollout(f"r{i}", f"task{i}", "own", events=[
        Message("user", f"I am {said}"),
        Call("lookup", {"who": said}, output={"ref": returned}, error=False, call_id="a"),
        Call("act", {"ref": returned, "who": said}, output={"ok": True}, error=False, call_id="b"),
    ])  # fmt: skip


def test_the_grounding_rule_reads_where_values_came_from_not_parameter_names():
    """Whatever the parameters are called: a value minted by a tool's output is proposed; a value only the user's
    message carried is proposed when each value serves many tasks (something the system holds, quoted), not when
    each user brings their own; one value in every call is a constant, never proposed."""
    own = observe([_conversation(i, f"u{i}@example.com", f"R{i}") for i in range(40)])
    shared = observe([_conversation(i, f"ACCT-{i % 4}", f"R{i}") for i in range(40)])
    constant = observe([_conversation(i, "ACCT-7", f"R{i}") for i in range(40)])
    s = DraftSettings()

    def chosen(ev: Evidence, tool: str) -> dict[str, bool]:
        return {g.path: g.proposed for g in grounded(ev.tools[tool], s)}

    assert chosen(own, "act") == {"ref": True, "who": False}
    assert chosen(own, "lookup") == {"who": False}
    assert chosen(shared, "act") == {"ref": True, "who": True}  # 4 values, 10 tasks each
    assert chosen(constant, "act") == {"ref": True, "who": False}
    reason = next(g.why for g in grounded(own.tools["act"], s) if g.path == "who")
    assert "what users say about themselves" in reason
    assert {g.path: g.proposed for g in grounded(own.tools["act"], DraftSettings(min_reuse=0))}["who"]
