"""Scoring a shard collects garbage less often, and leaves the collector as it found it."""

from __future__ import annotations

import gc

import pytest

from pipeline.scoring import shard


def test_a_shard_raises_the_collection_threshold_and_restores_it_even_on_failure() -> None:
    before = gc.get_threshold()
    with shard._fewer_collections():
        assert gc.get_threshold()[0] >= shard._SHARD_GC_THRESHOLD
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.isenabled()  # cycles are still collected: memory cannot pile up
    assert gc.get_threshold() == before
    with pytest.raises(OSError), shard._fewer_collections():
        raise OSError("storage failed mid-shard")
    assert gc.get_threshold() == before
