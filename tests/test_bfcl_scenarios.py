"""BFCL scenarios loaded once and copied: a copy answers every ground-truth call as a fresh load does, keeps
the fresh load's knowledge text, and what a copy could not stand for exactly is loaded afresh."""

from __future__ import annotations

import json
import math
import random
import re
import sys
from typing import Any

import pytest

from pipeline.core.records import parse_rollout
from pipeline.envs.bfcl import official as official
from pipeline.envs.bfcl._scenarios import Scenarios, knowledge_text, load
from pipeline.envs.bfcl.env import _run
from pipeline.ingest.bfcl import ground_truth_records

ADDRESS = re.compile(r" at 0x[0-9a-f]+>")  # `str` of a random generator: where it lives, nothing it holds


def _state(instance: Any) -> tuple[str | None, list[Any]]:
    """An instance's attributes as text (generators without their address) and its generators' states."""
    text = knowledge_text(instance)
    generators = [v.getstate() for v in vars(instance).values() if type(v) is random.Random]
    return (ADDRESS.sub(">", text) if text else text), generators


@pytest.mark.parametrize("tag", ["v3", "v4"])
def test_a_copied_scenario_answers_every_ground_truth_call_as_a_fresh_load(tag):
    release, scenarios = official.release(tag), Scenarios()
    copies = calls = 0
    for rollout in map(parse_rollout, ground_truth_records(tag, f"bfcl_{tag}")):
        config, long_context = rollout.env["initial_config"], rollout.env.get("long_context", False)
        for name in rollout.env["involved_classes"]:
            cls, stateless = release.simulator_class(name), name in official.STATELESS
            scenario, first = scenarios.start(cls, config.get(name, {}), long_context, stateless)
            _, copy = scenarios.start(cls, config.get(name, {}), long_context, stateless)
            fresh = load(cls, config.get(name, {}), long_context, stateless)
            copies += scenario.pickled is not None
            assert _state(copy) == _state(fresh) == _state(first)
            assert scenario.knowledge(copy) is not None
            assert ADDRESS.sub(">", scenario.knowledge(copy)) == _state(fresh)[0]
            for call in rollout.calls:
                if call.tool in {d["name"] for d in release.function_docs[name]}:
                    calls += 1
                    assert _run(copy, call.tool, call.arguments) == _run(fresh, call.tool, call.arguments), call
            assert _state(copy) == _state(fresh)
    assert copies > 900 and calls > 4000


def test_scenarios_are_kept_by_configuration_the_most_recently_used_first():
    tickets = official.release("v4").simulator_class("TicketAPI")
    scenarios = Scenarios(kept=2)

    def start(counter: int) -> Any:
        return scenarios.start(tickets, {"ticket_counter": counter}, False, False)[0]

    a, b = start(1), start(2)
    assert start(1) is a and a.pickled is not None  # a copy of the kept scenario
    c = start(3)  # one too many: the least recently used (2) goes
    assert start(1) is a and start(3) is c and start(2) is not b


def test_a_configuration_its_json_text_cannot_stand_for_is_loaded_afresh():
    tickets = official.release("v4").simulator_class("TicketAPI")
    scenarios = Scenarios()
    kept = scenarios.start(tickets, {"ticket_counter": None}, False, False)[0]
    assert kept.pickled is not None
    # the same JSON text (NaN is written null, a tuple as an array) for other values: not the kept scenario
    nan, instance = scenarios.start(tickets, {"ticket_counter": math.nan}, False, False)
    assert nan is not kept and nan.pickled is None and math.isnan(instance.ticket_counter)
    as_tuple, instance = scenarios.start(tickets, {"ticket_queue": (), "ticket_counter": 1}, False, False)
    assert as_tuple.pickled is None and instance.ticket_queue == ()
    assert scenarios.start(tickets, {"ticket_queue": [], "ticket_counter": 1}, False, False)[0].pickled is not None
    for config in ({1: "no text key"}, {"ticket_counter": 2**70}):  # no JSON text at all
        assert scenarios.start(tickets, config, False, False)[0].pickled is None
    # 1 and 1.0 are different texts, so different scenarios
    assert scenarios.start(tickets, {"ticket_counter": 1.0}, False, False)[1].ticket_counter.is_integer()
    assert type(scenarios.start(tickets, {"ticket_counter": 1}, False, False)[1].ticket_counter) is int


def test_long_context_scenarios_are_loaded_afresh_because_travel_shares_the_module_records():
    release = official.release("v4")
    travel = release.simulator_class("TravelAPI")
    instance = load(travel, {}, True, False)
    extension = sys.modules[travel.__module__].CREDIT_CARD_EXTENSION
    card = next(iter(extension))
    assert instance.credit_card_list[card] is extension[card]  # a booking would change the module's record
    scenario, _ = Scenarios().start(travel, {}, True, False)
    assert scenario.pickled is None and scenario.instance().credit_card_list[card] is extension[card]


def test_a_scenario_whose_generator_is_held_twice_is_loaded_afresh():
    class Twice:
        def __init__(self) -> None:
            self.generator = random.Random(7)
            self.again = {"generator": self.generator}

        def _load_scenario(self, scenario: dict[str, Any], long_context: bool = False) -> None:
            self.seen = json.dumps(scenario)

    scenario, instance = Scenarios().start(Twice, {"a": 1}, False, False)
    assert scenario.pickled is None and instance.again["generator"] is instance.generator
    copy = scenario.instance()
    assert copy.again["generator"] is copy.generator and copy.generator.random() == random.Random(7).random()
