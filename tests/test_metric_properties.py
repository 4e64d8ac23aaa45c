"""Properties of the aggregates (docs/explanation/definitions.md, "Aggregates") over random small rollout tables
(hypothesis)."""

from __future__ import annotations

import itertools
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_aggregate import _TYPES

from pipeline.apps.perf._fixtures import commit_parts
from pipeline.core import metric_catalogue
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings

B = 200  # small: each example runs the whole DuckDB pipeline


@st.composite
def rollouts(draw: st.DrawFn, allow_null_success: bool) -> list[dict[str, Any]]:
    n_tasks = draw(st.integers(1, 6))
    rows = []
    for _ in range(draw(st.integers(1, 24))):
        T = draw(st.integers(0, 7))
        fed = draw(st.integers(1, T + 1))  # FED <= T + 1 always
        success = draw(st.one_of(st.none(), st.booleans()) if allow_null_success else st.booleans())
        rows.append(
            {
                "task_id": f"t{draw(st.integers(0, n_tasks - 1))}",
                "benchmark": "b",
                "model": draw(st.sampled_from(["m1", "m2"])),
                "T": T,
                "fed": fed,
                "executable": fed == T + 1,
                "auc_term": 1.0 if T == 0 else (fed - 1) / T,
                "success": success,
                "n_output_mismatch": 0,
                "n_output_compared": T,
                "diverged_before_fed": False,
            }
        )
    return rows


def run_metrics(rows: list[dict[str, Any]], method: str, seed: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        table = pa.table({k: pa.array([r[k] for r in rows], _TYPES.get(k, pa.string())) for k in rows[0]})
        (Path(tmp) / "rollouts").mkdir()
        pq.write_table(table, Path(tmp) / "rollouts" / "part-0.parquet")
        commit_parts(tmp)
        return open_run(tmp).cohorts(settings=BootstrapSettings(B=B, seed=seed, method=method))  # type: ignore[arg-type]


# Each example runs the whole DuckDB stage (~0.15 s): `make test` tries 8 per property, `make fuzz` as many as
# it is given.
EXAMPLES = examples(8)
common = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.fuzz
methods = st.sampled_from(["multinomial", "poisson"])
seeds = st.integers(0, 2**32 - 1)


@common
@given(rows=rollouts(allow_null_success=True), method=methods, seed=seeds)
def test_pec_and_auc_shape(rows: list[dict[str, Any]], method: str, seed: int) -> None:
    for c in run_metrics(rows, method, seed):
        pec = c["pec"]
        assert pec[0] == {"k": 0, "value": 1.0, "lo": 1.0, "hi": 1.0}
        assert [p["k"] for p in pec] == list(range(len(pec)))
        for a, b in itertools.pairwise(pec):
            assert a["value"] >= b["value"]
            if a.get("method", "bootstrap") == b["method"] == "bootstrap":
                # Each replicate's PEC is non-increasing in k, so its order statistics are too. (Wilson bounds
                # on different effective sample sizes need not be ordered.)
                assert a["lo"] >= b["lo"] and a["hi"] >= b["hi"]
        ter, auc = c["ter"], c["auc_pec"]
        assert 0 <= ter["value"] <= auc["value"] <= 1
        if ter["method"] == auc["method"] == "bootstrap":
            assert ter["lo"] <= auc["lo"] and ter["hi"] <= auc["hi"]  # per replicate TER <= AUC as well
        mine = [r for r in rows if r["model"] == c["model"]]
        assert c["n"] == len(mine) and c["n_no_calls"] == sum(r["T"] == 0 for r in mine)
        assert [p["value"] for p in pec] == [
            sum(min(r["T"], r["fed"] - 1) >= k for r in mine) / len(mine) for k in range(len(pec))
        ]


@common
@given(rows=rollouts(allow_null_success=False), method=methods, seed=seeds)
def test_success_identity(rows: list[dict[str, Any]], method: str, seed: int) -> None:
    for c in run_metrics(rows, method, seed):
        mine = [r for r in rows if r["model"] == c["model"]]
        executable = [r for r in mine if r["executable"]]
        if not executable or len(executable) == len(mine):
            continue  # P(success | executable) or RR undefined
        p_exec = Fraction(sum(r["success"] for r in executable), len(executable))
        ter, rr, success = (Fraction(c[m]["value"]) for m in ("ter", "rr", "success"))
        assert abs(ter * p_exec + (1 - ter) * rr - success) < Fraction(1, 10**12)
        # ... and each term is the exact ratio of counts (to double precision).
        assert c["ter"]["value"] == len(executable) / len(mine)
        assert c["success"]["value"] == sum(r["success"] for r in mine) / len(mine)


@common
@given(rows=rollouts(allow_null_success=True), method=methods, seed=seeds)
def test_intervals_bracket_the_estimate(rows: list[dict[str, Any]], method: str, seed: int) -> None:
    """lo <= value <= hi, all within [0, 1], lo < hi (never zero-width, but PEC(0) = 1), or all three null.

    Percentile intervals need not contain the point estimate in general. Here every replicate value and
    the estimate are ratios of sums of the same per-task counts, a replicate that draws each task once
    reproduces the estimate exactly (bit for bit), and hypothesis has not found a table where fewer than
    2.5% of B = 200 replicates fall on either side of it.
    """
    for c in run_metrics(rows, method, seed):
        for m in (r.name for r in metric_catalogue.ratios()):
            value, lo, hi = c[m]["value"], c[m]["lo"], c[m]["hi"]
            if value is None:
                assert lo is None and hi is None
                continue
            assert lo is not None and hi is not None, (m, c)
            assert 0 <= lo <= value <= hi <= 1, (m, c[m])
            assert lo < hi, (m, c[m])  # never zero-width (docs/explanation/intervals.md, "Small samples")
        for p in c["pec"]:
            assert 0 <= p["lo"] <= p["value"] <= p["hi"] <= 1, p
            assert p["k"] == 0 or p["lo"] < p["hi"], p
