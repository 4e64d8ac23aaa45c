"""Spec loading: clear errors naming the file and place; the undo journal; third-party environments."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.model import Call, Rollout
from pipeline.envs import EnvError, EnvOptions, SpecError, forget_unresolved, get_environment
from pipeline.envs.data import BUILTIN_SPECS
from pipeline.envs.document import JournaledDoc
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.envs.spec.loader import load_spec

SHOP = BUILTIN_SPECS / "shop"


@pytest.fixture
def spec_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "shop2"
    shutil.copytree(SHOP, folder)
    return folder


def edit(folder: Path, old: str, new: str) -> None:
    path = folder / "spec.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_shipped_spec_loads():
    spec = load_spec(SHOP)
    assert spec.name == "shop" and len(spec.tools) == 11
    assert spec.tools["place_order"].info.grounded == {"user_id", "items[].product_id", "payment_method_id"}


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('version = "1.0.0"', 'version = "1.0.0"\ncolour = "red"', "spec.toml: unknown field(s) colour"),
        ("[tool.get_product]", "[tool.get_product]\nretries = 3", "[tool.get_product]: unknown field(s) retries"),
        (
            "has(state.products, args.product_id)",
            "has(state.products, args.product_id",
            "[tool.get_product] preconditions[0]",
        ),
        ("has(state.products, args.product_id)", "__import__('os')", "[tool.get_product] preconditions[0]"),
        ("has(state.products, args.product_id)", "secret.x", "[tool.get_product] preconditions[0]"),
        ("[tool.open_ticket]", "[tool.close_ticket]", "[tool.close_ticket] has no schema in tools.json"),
        ('grounded = ["product_id"]', 'grounded = ["sku"]', "grounded parameter 'sku' is not a parameter"),
        ('{ set = "state.session.user_id"', '{ set = "args.user_id"', "effects may only change the state"),
        ('{ set = "state.session.user_id", value = "uid" }', '{ set = "state.session.user_id" }', "needs a 'value'"),
    ],
)
def test_bad_specs_name_the_file_and_place(spec_copy, old, new, message):
    edit(spec_copy, old, new)
    with pytest.raises(SpecError) as err:
        load_spec(spec_copy)
    assert message in str(err.value)
    assert str(spec_copy) in str(err.value)


def test_invalid_json_schema_is_reported(spec_copy):
    tools = json.loads((spec_copy / "tools.json").read_text())
    tools[0]["function"]["parameters"]["properties"]["email"]["type"] = "text"
    (spec_copy / "tools.json").write_text(json.dumps(tools))
    with pytest.raises(SpecError, match=r"\[tool.authenticate\]: tool 'authenticate': parameters are not a valid"):
        load_spec(spec_copy)


def test_spec_search_path(spec_copy, monkeypatch):
    monkeypatch.setenv("PEXEC_SPEC_PATH", str(spec_copy.parent))
    env = get_environment("shop2")
    assert isinstance(env, SpecEnvironment) and env.spec.folder == str(spec_copy)
    with pytest.raises(EnvError, match="unknown environment 'nope'"):
        get_environment("nope")


def test_a_mistyped_environment_suggests_spec_folders_too(spec_copy):
    options = EnvOptions(spec_dirs=(str(spec_copy.parent),))
    with pytest.raises(EnvError) as refused:
        get_environment("shopp2", options)  # the spec folder shop2 is one letter away
    said = str(refused.value)
    assert said.startswith("unknown environment 'shopp2' (did you mean 'shop2'?): not registered (bfcl_v3,")
    assert said.endswith("(specs: shop, shop2, support; --spec-dir adds a folder of specs)")


def test_effect_failure_rolls_back_the_partial_change(spec_copy):
    # The second effect fails (no such list) after the first one has changed the state.
    edit(
        spec_copy,
        '{ append = "state.tickets"',
        '{ set = "state.session.note", value = "1" },\n  { append = "state.nope"',
    )
    env = SpecEnvironment.from_folder(spec_copy)
    state = env.start(Rollout("r", "t", "shop2"))
    before = json.dumps(state.doc, sort_keys=True)
    outcome = env.execute(state, "open_ticket", {"summary": "help"}, Call("open_ticket", {}))
    assert not outcome.accepted and "cannot append" in outcome.message
    assert json.dumps(state.doc, sort_keys=True) == before


def test_rollout_may_replace_parts_of_the_initial_state():
    env = get_environment("shop")
    state = env.start(Rollout("r", "t", "shop", env={"state": {"coupons": {}}}))
    assert state.doc["coupons"] == {}
    state = env.start(Rollout("r2", "t", "shop"))
    assert "WELCOME10" in state.doc["coupons"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.fuzz
@settings(max_examples=examples(50), deadline=None)
@given(
    doc=st.dictionaries(st.text(max_size=2), json_values, max_size=4),
    ops=st.lists(st.tuples(st.sampled_from(["set", "del", "append"]), st.text(max_size=2), json_values), max_size=12),
)
def test_journal_rollback_restores_any_document(doc, ops):
    journaled = JournaledDoc(json.loads(json.dumps(doc)))
    marks = [(0, json.dumps(journaled.doc, sort_keys=True))]
    for op, key, value in ops:
        if op == "set":
            journaled.set(journaled.doc, key, value)
        elif op == "del" and key in journaled.doc:
            journaled.delete(journaled.doc, key)
        elif op == "append":
            if not isinstance(journaled.doc.get(key), list):
                journaled.set(journaled.doc, key, [])
            target = journaled.doc[key]
            journaled.set(target, len(target), value)
        marks.append((len(journaled.journal), json.dumps(journaled.doc, sort_keys=True)))
    for mark, snapshot in reversed(marks):
        journaled.rollback(mark)
        assert json.dumps(journaled.doc, sort_keys=True) == snapshot


def test_third_party_environment_through_an_entry_point(tmp_path, monkeypatch):
    # A real installed-distribution layout on sys.path, found through importlib.metadata.
    (tmp_path / "toy_env.py").write_text(
        "from pipeline.envs.observed import ObservedEnvironment\n"
        "def factory(options):\n"
        "    env = ObservedEnvironment()\n"
        "    env.name = 'toy'\n"
        "    return env\n"
    )
    dist = tmp_path / "toy_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pexec.environments]\ntoy = toy_env:factory\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_unresolved()  # the entry points are read once per scoring run: this is a new one
    env = get_environment("toy", EnvOptions(policy="code"))
    assert env.name == "toy"
    sys.modules.pop("toy_env", None)
    monkeypatch.undo()
    forget_unresolved()


def test_runaway_let_is_a_precondition_failure_with_its_reason(spec_copy):
    # The measured case: a `let` chain that doubles a string 40 times (2.7 GB, then MemoryError, before budgets).
    lets = ", ".join(["s0 = \"'ab'\"", *(f"s{i} = 's{i - 1} + s{i - 1}'" for i in range(1, 41))])
    edit(spec_copy, "let = { tid = \"'T' + str(1 + len(state.tickets))\" }", f"let = {{ tid = \"'T'\", {lets} }}")
    env = SpecEnvironment.from_folder(spec_copy)
    state = env.start(Rollout("r", "t", "shop2"))
    before = json.dumps(state.doc, sort_keys=True)
    outcome = env.execute(state, "open_ticket", {"summary": "help"}, Call("open_ticket", {}))
    assert not outcome.accepted
    assert outcome.message.startswith("open_ticket failed: evaluation budget exceeded: builds more than 10,000,000")
    assert re.search(r"evaluating: s(\d+) \+ s\1$", outcome.message)  # names the let that went over
    assert json.dumps(state.doc, sort_keys=True) == before
