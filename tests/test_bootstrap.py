"""pipeline.metrics.bootstrap: the replicates' sums in numpy are exact, and the mergeable Poisson bootstrap gives the
same sums however the rollouts are sharded (docs/explanation/intervals.md; docs/explanation/measured-facts.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_aggregate import draws, lb32, poisson_thresholds, random_rows, weights, write_rollouts

from pipeline.metrics import bootstrap
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings


def task_key(task_id: str) -> int:
    """The first 8 bytes of md5(task_id), little-endian (metrics/sql/hash.sql pexec_task_key), independently."""
    return int.from_bytes(hashlib.md5(task_id.encode()).digest()[:8], "little")


def merged_weights(seed: int, B: int, keys: list[int]) -> list[list[int]]:
    """w(b, task) of the mergeable Poisson bootstrap, from the uint64 reference hash of tests/test_aggregate.py."""
    rep = lb32(lb32(np.uint64(seed)) ^ np.arange(B, dtype=np.uint64))
    lo = np.array([k & 0xFFFFFFFF for k in keys], dtype=np.uint64)
    hi = np.array([k >> 32 for k in keys], dtype=np.uint64)
    h = lb32(lb32(rep[:, None] ^ lo[None, :]) ^ hi[None, :])
    return (h[:, :, None] >= poisson_thresholds()[None, None, :]).sum(axis=2).tolist()


@pytest.mark.parametrize("method", ["multinomial", "poisson"])
def test_replicate_sums_exact_for_huge_sums(method: str) -> None:
    # Per-task sums up to 2^60 (auc in 2^-40 units of a task with ~10^6 rollouts) and negative ones: the float
    # products must still give the exact integer sums Python integers give.
    rng = np.random.default_rng(3)
    m, B = 37, 25
    sums = np.stack([rng.integers(0, 2**60, m), rng.integers(-(2**40), 2**40, m), rng.integers(0, 5, m)], axis=1)
    batches = list(bootstrap.replicate_sums([sums], ["s_a", "s_b", "s_c"], seed=9, B=B, method=method))
    got: dict[tuple[int, str], int] = {}
    for batch in batches:
        for row in batch.to_pylist():
            key = (row["b"], row["part"])
            got[key] = got.get(key, 0) + row["total"] * 2 ** row["shift"]
    w = weights(9, B, m, method).astype(np.int64).tolist()
    for b in range(B):
        for j, part in enumerate(["s_a", "s_b", "s_c"]):
            assert got[(b, part)] == sum(w[b][i] * int(sums[i, j]) for i in range(m))


def test_numpy_draws_are_the_sql_ones() -> None:
    keys = bootstrap.replicate_keys(123, 40)
    h = bootstrap.lb32(keys[:, None] ^ bootstrap.lb32(np.arange(50, dtype=np.uint32))[None, :])
    assert np.array_equal(h.astype(np.uint64), draws(123, 40, 50))
    assert np.array_equal(bootstrap.POISSON1.astype(np.uint64), poisson_thresholds())


rollout_rows = st.lists(
    st.tuples(
        st.integers(0, 2),  # cohort
        st.integers(0, 9),  # task
        st.integers(0, 2**45),  # a big part (auc units)
        st.integers(0, 3),  # a small one
        st.integers(0, 4),  # the shard it is scored in
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=40, deadline=None)
@given(rows=rollout_rows, seed=st.integers(0, 2**32 - 1))
def test_merged_equals_single_node_for_any_sharding(rows: list[tuple[int, int, int, int, int]], seed: int) -> None:
    B = 30
    cohorts = ["a", "b", "c"]
    ids = [f"task-{t}" for t in range(10)]

    def partial(subset: list[tuple[int, int, int, int, int]]) -> bootstrap.PoissonPartial:
        codes = np.array([r[0] for r in subset], dtype=np.int64)
        keys = np.array([task_key(ids[r[1]]) for r in subset], dtype=np.uint64)
        sums = np.array([[r[2], r[3]] for r in subset], dtype=np.int64).reshape(len(subset), 2)
        return bootstrap.poisson_partial(cohorts, codes, keys, sums, ["s_big", "s_small"], seed, B)

    shards = [[r for r in rows if r[4] == s] for s in range(5)]
    merged = bootstrap.merge([partial(s) for s in shards if s])
    single = partial(rows)
    assert merged.sums.keys() == single.sums.keys()
    w = merged_weights(seed, B, [task_key(t) for t in ids])
    for c, name in enumerate(cohorts):
        mine = [r for r in rows if r[0] == c]
        if not mine:
            assert name not in merged.sums
            continue
        assert merged.sums[name].tolist() == single.sums[name].tolist()
        expected = [[sum(r[2 + j] for r in mine) for j in range(2)]]
        expected += [[sum(w[b][r[1]] * r[2 + j] for r in mine) for j in range(2)] for b in range(B)]
        assert merged.sums[name].tolist() == expected


def test_merge_refuses_different_bootstraps() -> None:
    one = bootstrap.poisson_partial(["a"], np.zeros(1, np.int64), np.ones(1, np.uint64), np.ones((1, 1), np.int64),
                                    ["s_n"], 0, 5)  # fmt: skip
    other = bootstrap.poisson_partial(["a"], np.zeros(1, np.int64), np.ones(1, np.uint64), np.ones((1, 1), np.int64),
                                      ["s_n"], 1, 5)  # fmt: skip
    with pytest.raises(ValueError, match="cannot be merged"):
        bootstrap.merge([one, other])


def test_metrics_poisson_merged(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows = random_rows(rng, 60, 4, "bench", model="m1") + random_rows(rng, 45, 3, "bench", model="m2")
    write_rollouts(tmp_path, rows)
    B, seed = 200, 17
    cohorts = open_run(str(tmp_path)).cohorts(["model"], BootstrapSettings(B=B, seed=seed, method="poisson-merged"))
    for c in cohorts:
        assert c["bootstrap"]["method"] == "poisson-merged"
        mine = [r for r in rows if r["model"] == c["model"]]
        tasks = sorted({r["task_id"] for r in mine})
        w = merged_weights(seed, B, [task_key(t) for t in tasks])
        index = {t: i for i, t in enumerate(tasks)}
        executable = [[sum(w[b][index[r["task_id"]]] * r["executable"] for r in mine) for b in range(B)]]
        n = [sum(w[b][index[r["task_id"]]] for r in mine) for b in range(B)]
        ter = np.array([e / d for e, d in zip(executable[0], n, strict=True) if d > 0])
        assert c["ter"]["method"] == "bootstrap"
        assert c["ter"]["lo"] == pytest.approx(float(np.quantile(ter, 0.025, method="linear")), rel=1e-12)
        assert c["ter"]["hi"] == pytest.approx(float(np.quantile(ter, 0.975, method="linear")), rel=1e-12)


@given(
    st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)), max_size=40),
)
def test_moments_exact_for_any_int64(pairs: list[tuple[int, int]]) -> None:
    """The moments are exact integers for any int64 sums (the auc part's squares overflow 64 bits)."""
    y = np.array([p[0] for p in pairs], dtype=np.int64)
    x = np.array([p[1] for p in pairs], dtype=np.int64)
    got = bootstrap.moments(y, x)
    assert (got.yy, got.xy, got.xx) == (
        sum(v * v for v, _ in pairs),
        sum(v * w for v, w in pairs),
        sum(w * w for _, w in pairs),
    )
    assert (got.num_total, got.den_total) == (sum(v for v, _ in pairs), sum(w for _, w in pairs))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**80), 2**80), min_size=1, max_size=12), st.booleans())
def test_partial_sums_are_exact_for_any_integer(values: list[int], within_int64: bool) -> None:
    """Exact partial sums for the SQL: as they are where every sum of the cohort fits in int64, else as limbs of 32
    bits (hi * 2^32 + lo) split from Python ints."""
    if within_int64:
        values = [v % 2**64 - 2**63 for v in values]
    total = np.array([[v, -v] for v in values], dtype=object)
    partial = bootstrap.PoissonPartial(0, len(values) - 1, ("s_a", "s_b"), {3: total})
    wide, limbs = bootstrap.partial_tables(partial, plain=True)
    fits = all(-(2**63) <= x < 2**63 for v in values for x in (v, -v))
    assert (wide.num_rows, limbs.num_rows) == ((len(values), 0) if fits else (0, 4 * len(values)))
    rebuilt: dict[tuple[int, str], int] = {}
    for row in limbs.to_pylist():
        assert row["cohort"] == 3 and row["shift"] in (0, 32)
        key = (row["b"], row["part"])
        rebuilt[key] = rebuilt.get(key, 0) + (row["total"] << row["shift"])
    for row in wide.to_pylist():
        assert row["cohort"] == 3
        rebuilt |= {(row["b"], "s_a"): row["s_a"], (row["b"], "s_b"): row["s_b"]}
    signs = (("s_a", 1), ("s_b", -1))
    assert rebuilt == {(b - 1, part): v * sign for b, v in enumerate(values) for part, sign in signs}


@pytest.mark.parametrize("method", ["multinomial", "poisson"])
def test_replicate_sums_are_the_same_wide_and_as_limbs(method: str) -> None:
    """A cohort whose sums fit in 64 bits comes wide, one with a column near 2^60 as limbs; both exact."""
    rng = np.random.default_rng(5)
    small = np.stack([rng.integers(0, 2**40, 30), rng.integers(-(2**20), 2**20, 30), np.zeros(30, np.int64)], axis=1)
    huge = small.copy()
    huge[:, 0] = rng.integers(0, 2**60, 30)
    columns = ["s_a", "s_b", "s_c"]
    batches = bootstrap.replicate_sums([small, huge], columns, seed=4, B=40, method=method, first=7, wide=True)
    wide, limbs = bootstrap.replicate_tables(batches, columns)
    assert set(wide["cohort"].to_pylist()) == {7} and set(limbs["cohort"].to_pylist()) == {8}
    w = weights(4, 40, 30, method).astype(np.int64).astype(object)
    for cohort, sums, table in ((7, small, wide), (8, huge, limbs)):
        exact = (w @ sums.astype(object)).tolist()
        if table is wide:
            got = [[row[c] for c in columns] for row in sorted(table.to_pylist(), key=lambda r: r["b"])]
        else:
            got = [[0] * 3 for _ in range(40)]
            for row in table.to_pylist():
                got[row["b"]][columns.index(row["part"])] += row["total"] << row["shift"]
        assert got == exact, cohort
