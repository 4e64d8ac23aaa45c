"""The run's output tables: built in batches (as a shard converts its results), they equal one build."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.records import parse_rollout
from pipeline.core.run_schema import ROLLOUTS, STEPS
from pipeline.envs import get_environment
from pipeline.replay.checker import replay
from pipeline.scoring.run_tables import combined, rollouts_table, steps_table
from pipeline.synthetic.rollouts import synthesize


def _varied(i: int, record: dict[str, Any]) -> dict[str, Any]:
    """Labels, attributes and costs that only some batches carry."""
    record["labels"] = {"model": "m"} if i < 4 else {"zeta": str(i), "alpha": "a"}
    record["attributes"] = {"seed": str(i)} if i % 3 == 0 else {}
    record["cost"] = {"tokens": i} if i < 6 else {"dollars": i / 10}
    return record


@pytest.mark.parametrize("table, build", [(STEPS, steps_table), (ROLLOUTS, rollouts_table)])
def test_batches_combine_to_the_table_of_all_results(table: Any, build: Any) -> None:
    env = get_environment("shop")
    records = [_varied(i, r) for i, r in enumerate(synthesize("shop", 9, 5, seed=3))]
    results = [replay(env, parse_rollout(r)) for r in records]
    whole = build("run", results)
    batches = [build("run", results[a:b]) for a, b in ((0, 4), (4, 5), (5, 9))]
    assert {n for b in batches for n in b.column_names} == set(whole.column_names)
    assert any(b.column_names != whole.column_names for b in batches)  # the batches do differ
    together = combined(batches, table)
    assert together.schema == whole.schema
    assert together.to_pylist() == whole.to_pylist()
    assert combined(batches[:1], table) is batches[0]
