"""The depth limit of records (pipeline.core.records.too_deep): decided by orjson's own limit where it can, the same
answer as walking the value level by level."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core import records
from pipeline.core.errors import InvalidRecord
from pipeline.core.records import MAX_DEPTH, parse_rollout, too_deep

INNER = st.one_of(
    st.none(),
    st.integers(),  # beyond 64 bits orjson refuses: the walk decides
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.lists(st.none(), max_size=1), max_size=2),
    st.tuples(st.lists(st.none(), max_size=1)),  # not walked; orjson writes tuples as lists
    st.dictionaries(st.integers(0, 3), st.none(), min_size=1, max_size=1),  # keys orjson does not write
)


def nested(levels: int, inner: Any, kinds: list[bool]) -> Any:
    value = inner
    for i in range(levels):
        value = [1, value] if kinds[i % len(kinds)] else {"k": value, "other": []}
    return value


def walked(value: Any) -> bool:
    with patch.object(records, "_ORJSON_LIMIT_HOLDS", False):
        return too_deep(value)


def test_orjson_refuses_what_the_padding_assumes() -> None:
    assert records._ORJSON_LIMIT_HOLDS  # else every depth check walks (right, slower)


@given(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3), INNER, st.lists(st.booleans(), min_size=1, max_size=3))
def test_the_fast_check_answers_as_the_walk(levels: int, inner: Any, kinds: list[bool]) -> None:
    value = nested(levels, inner, kinds)
    assert too_deep(value) == walked(value)


@pytest.mark.parametrize(("levels", "deep"), [(MAX_DEPTH - 4, False), (MAX_DEPTH - 3, True)])
def test_a_record_at_the_limit_is_scored_one_level_more_is_rejected(levels: int, deep: bool) -> None:
    # The record, its events list and an event are three levels; the arguments `levels` + 1 more.
    record = {"rollout_id": "r", "task_id": "t", "benchmark": "shop", "events": [
        {"type": "call", "tool": "get_user", "arguments": nested(levels, {}, [True, False])}
    ]}  # fmt: skip
    assert too_deep(record) == walked(record) == deep
    if deep:
        with pytest.raises(InvalidRecord, match=f"nests deeper than {MAX_DEPTH} levels"):
            parse_rollout(record)
    else:
        assert parse_rollout(record).rollout_id == "r"
