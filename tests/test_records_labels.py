"""A rollout's label names against the output columns (pipeline.core.records): a name fit once is remembered, and
the answer for every name is the rule's, whatever names came before and however many."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import records
from pipeline.core.errors import InvalidRecord
from pipeline.core.model import Rollout, RolloutResult
from pipeline.core.records import check_rollout, parse_rollout
from pipeline.core.run_schema import ATTRIBUTE_PREFIX, RESERVED_COLUMNS
from pipeline.scoring.run_tables import rollouts_table, steps_table

# Output column names in any case, names that start like a cost or attribute column, and others.
NAMES = st.one_of(
    st.sampled_from(sorted(RESERVED_COLUMNS)).flatmap(lambda c: st.sampled_from([c, c.upper(), c.title()])),
    st.sampled_from(["cost_usd", "Cost_x", ATTRIBUTE_PREFIX + "seed", ATTRIBUTE_PREFIX.upper() + "a"]),
    st.text(min_size=1, max_size=6),
)


def clashes(name: str) -> bool:
    return name.lower() in {c.lower() for c in RESERVED_COLUMNS} or name.lower().startswith(("cost_", ATTRIBUTE_PREFIX))


def accepted(labels: dict[str, str]) -> bool:
    rollout = Rollout("r", "t", "b", labels=labels)
    try:
        check_rollout(rollout)
    except InvalidRecord as exc:
        assert "clashes with an output column name" in str(exc)
        answer = False
    else:
        answer = True
    record = {"rollout_id": "r", "task_id": "t", "benchmark": "b", "labels": labels, "events": [], "success": None}
    try:
        parse_rollout(record)
    except InvalidRecord:
        assert not answer
    else:
        assert answer
    return answer


@settings(max_examples=300)
@given(st.lists(NAMES, min_size=1, max_size=8), st.integers(0, 2))
def test_every_name_is_judged_by_the_rule_whatever_came_before(names: list[str], room: int) -> None:
    # `room`: the remembered names may fill up (at 0 none is kept) before or while these are judged
    with patch.object(records, "_LABEL_NAMES", set()), patch.object(records, "_KEPT_LABEL_NAMES", room):
        for name in names + names:  # each judged twice: the second time it may have been remembered
            assert accepted({name: "x"}) == (not clashes(name))
            assert name in records._LABEL_NAMES or clashes(name) or len(records._LABEL_NAMES) >= room


@pytest.mark.parametrize("field", ["labels", "attributes"])
def test_a_rollout_holds_at_most_max_labels_labels_and_as_many_attributes(field):
    """Each is a column of the run's tables: past the limit the rollout is a reject, the same from both readers."""
    names = {f"n{i}": "v" for i in range(records.MAX_LABELS)}
    at = Rollout("r", "t", "b", **{field: names})
    assert check_rollout(at) == at and parse_rollout(records.rollout_record(at)) == at
    over = Rollout("r", "t", "b", **{field: {**names, "one_more": "v"}})
    said = f"{records.MAX_LABELS + 1} {field} are over the limit of {records.MAX_LABELS} for one rollout"
    with pytest.raises(InvalidRecord, match=said):
        check_rollout(over)
    with pytest.raises(InvalidRecord, match=said):
        parse_rollout(records.rollout_record(over))


@pytest.mark.parametrize(("field", "what"), [("labels", "labels"), ("attributes", "attributes"), ("cost", "costs")])
def test_two_names_of_one_rollout_that_differ_only_in_case_are_a_reject(field: str, what: str) -> None:
    """SQL names are case-insensitive: `model` and `MODEL` would be one column, read as `MODEL` and `model_1`."""
    value: str | float = 1.0 if field == "cost" else "v"
    both = Rollout("r", "t", "b", **{field: {"model": value, "MODEL": value}})
    said = f"{what} 'model' and 'MODEL' differ only in letter case"
    with pytest.raises(InvalidRecord, match=said):
        check_rollout(both)
    with pytest.raises(InvalidRecord, match=said):
        parse_rollout(records.rollout_record(both))
    one = Rollout("r", "t", "b", **{field: {"model": value, "method": value}})
    assert check_rollout(one) == one


def test_rollouts_that_spell_one_label_differently_share_its_column() -> None:
    """Across rollouts the spellings are one label, named by the spelling that sorts first, in both tables; a
    DuckDB read of the parts sees one `model` column, not `MODEL` beside `model_1`."""
    results = [
        RolloutResult(Rollout("r1", "t", "b", labels={"model": "x"}, attributes={"Seed": "1"}, cost={"usd": 1.0}), []),
        RolloutResult(Rollout("r2", "t", "b", labels={"MODEL": "y"}, attributes={"seed": "2"}, cost={"USD": 2.0}), []),
    ]
    rollouts = rollouts_table("run", results)
    assert rollouts["MODEL"].to_pylist() == ["x", "y"] and "model" not in rollouts.column_names
    assert rollouts[ATTRIBUTE_PREFIX + "Seed"].to_pylist() == ["1", "2"] and rollouts["cost_USD"].to_pylist() == [1, 2]
    steps = steps_table("run", results).column_names
    assert "MODEL" in steps and ATTRIBUTE_PREFIX + "Seed" in steps and "model" not in steps
