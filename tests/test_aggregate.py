"""pipeline.metrics.cohorts: metrics, task-level bootstrap intervals, read-only SQL (docs/explanation/definitions.md;
docs/explanation/intervals.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal, getcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.perf._fixtures import commit_parts
from pipeline.core.errors import QueryRefused
from pipeline.metrics.query import QueryError
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings

# --- helpers: build a scored run in tmp_path -------------------------------------------------------------


def rollout(
    task: str,
    T: int,
    fed: int,
    success: bool | None,
    benchmark: str = "bench",
    **labels: str | None,
) -> dict[str, Any]:
    """One row of RUN/rollouts, with the derived columns filled in as the scorer defines them."""
    assert 1 <= fed <= T + 1
    executable = fed == T + 1
    return {
        "task_id": task,
        "benchmark": benchmark,
        **labels,
        "T": T,
        "fed": fed,
        "executable": executable,
        "auc_term": 1.0 if T == 0 else (fed - 1) / T,
        "success": success,
        "recovered": None if success is None else (not executable and success),
        "first_cause": None if executable else "precondition",
        "n_invalid": 0 if executable else 1,
        "n_output_mismatch": 0,
        "n_output_compared": T,
        "diverged_before_fed": False,
        "cost_tokens": 100.0,
    }


_TYPES = {
    "T": pa.int32(),
    "fed": pa.int32(),
    "executable": pa.bool_(),
    "auc_term": pa.float64(),
    "success": pa.bool_(),
    "recovered": pa.bool_(),
    "n_invalid": pa.int32(),
    "n_output_mismatch": pa.int32(),
    "n_output_compared": pa.int32(),
    "diverged_before_fed": pa.bool_(),
    "cost_tokens": pa.float64(),
    "n_writes": pa.int32(),
    "n_unclassified": pa.int32(),
    "n_invalid_irreversible": pa.int32(),
    "write_fed": pa.int32(),
    "write_auc_term": pa.float64(),
    "weighted_auc_term": pa.float64(),
    "fed_schema": pa.int32(),
    "fed_schema_dependency": pa.int32(),
}


def write_rollouts(run: Path, rows: Sequence[dict[str, Any]], part: str = "part-0") -> None:
    names = ["run_id", "rollout_id", *rows[0].keys()]
    cols: dict[str, list[Any]] = {n: [] for n in names}
    for i, row in enumerate(rows):
        full = {"run_id": "run", "rollout_id": f"{part}-{i}", **row}
        for n in names:
            cols[n].append(full[n])
    table = pa.table({n: pa.array(v, _TYPES.get(n, pa.string())) for n, v in cols.items()})
    (run / "rollouts").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run / "rollouts" / f"{part}.parquet")
    commit_parts(str(run))  # a complete run: readers refuse anything else


def write_steps(run: Path, n: int) -> None:
    table = pa.table(
        {
            "run_id": ["run"] * n,
            "rollout_id": [f"r{i // 2}" for i in range(n)],
            "task_id": ["t"] * n,
            "benchmark": ["bench"] * n,
            "step": pa.array([1 + i % 2 for i in range(n)], pa.int32()),
            "valid": [i % 3 != 0 for i in range(n)],
        }
    )
    (run / "steps").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run / "steps" / "part-0.parquet")
    commit_parts(str(run))  # the markers record the part as it is now (readers check parts against them)


def paper_rows() -> list[dict[str, Any]]:
    """docs/explanation/definitions.md, "The identity and the paper check": 200 episodes = 50 tasks x 4 episodes; 10
    fully executable and successful; 190 with an invalid prefix, 138 of them successful."""
    rows = []
    for i in range(200):
        task = f"task-{i // 4:02d}"
        if i < 10:
            rows.append(rollout(task, T=3, fed=4, success=True))
        else:
            rows.append(rollout(task, T=4, fed=1 + i % 4, success=(i - 10) < 138))
    return rows


def random_rows(rng: np.random.Generator, n_tasks: int, per_task: int, benchmark: str, **labels: str) -> list:
    rows = []
    for t in range(n_tasks):
        p_task = rng.beta(0.7, 0.7)
        for _ in range(int(rng.integers(1, per_task + 1))):
            T = int(rng.integers(0, 9))
            fed = T + 1 if rng.random() < 0.3 else int(rng.integers(1, T + 2))
            u = rng.random()
            success = None if u < 0.05 else bool(rng.random() < p_task)
            rows.append(rollout(f"t{t:03d}", T, fed, success, benchmark, **labels))
    return rows


# --- the paper's worked example -------------------------------------------------------------------------


def test_paper_example_exact(tmp_path: Path) -> None:
    write_rollouts(tmp_path, paper_rows())
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=200))
    assert (c["benchmark"], c["n"], c["n_tasks"], c["n_no_calls"]) == ("bench", 200, 50, 0)
    assert c["ter"]["value"] == 0.05
    assert c["rr"]["value"] == 138 / 190
    assert round(c["rr"]["value"], 4) == 0.7263
    assert c["rr"]["eligible"] == 190
    assert c["success"]["value"] == 0.74
    assert c["successes_after_invalid_prefix"]["value"] == 138 / 148
    assert round(c["successes_after_invalid_prefix"]["value"], 3) == 0.932
    # success = TER * P(success | executable) + (1 - TER) * RR, exactly (P(success | executable) = 10/10).
    ter, rr = Fraction(c["ter"]["value"]), Fraction(c["rr"]["value"])
    identity = ter * Fraction(10, 10) + (1 - ter) * rr
    assert abs(identity - Fraction(c["success"]["value"])) < Fraction(1, 10**12)
    assert Fraction(10, 200) * 1 + Fraction(190, 200) * Fraction(138, 190) == Fraction(148, 200)
    for m in ("success", "ter", "auc_pec", "rr", "successes_after_invalid_prefix"):
        assert 0 <= c[m]["lo"] <= c[m]["value"] <= c[m]["hi"] <= 1, m


# --- an independent numpy implementation of the same bootstrap ------------------------------------------

MASK32 = np.uint64(0xFFFFFFFF)


def comparable(result: tuple[Any, Any]) -> tuple[Any, Any]:
    """(cohorts or profiles, replicates) with each replicate array as a list, NaN as None: comparable with ==."""
    items, replicates = result

    def listed(values: np.ndarray) -> list[float | None]:
        return [None if math.isnan(v) else v for v in values.tolist()]

    return items, [
        {m: listed(v) for m, v in per.items()} if isinstance(per, dict) else listed(per) for per in replicates
    ]


def lb32(x: np.ndarray | int) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint64)
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & MASK32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & MASK32
    return x ^ (x >> np.uint64(16))


def draws(seed: int, B: int, m: int) -> np.ndarray:
    """h(seed, b, i) for b < B, i < m, as docs/explanation/intervals.md defines it."""
    keys = lb32(lb32(seed) ^ np.arange(B, dtype=np.uint64))
    return lb32(keys[:, None] ^ lb32(np.arange(m, dtype=np.uint64))[None, :])


def poisson_thresholds() -> np.ndarray:
    getcontext().prec = 50
    e, F, fact, out = Decimal(-1).exp(), Decimal(0), 1, []
    for k in range(40):
        fact *= max(k, 1)
        F += e / fact
        t = int((F * 2**32).to_integral_value(rounding="ROUND_CEILING"))
        if t >= 2**32:
            break
        out.append(t)
    return np.array(out, dtype=np.uint64)


def weights(seed: int, B: int, m: int, method: str) -> np.ndarray:
    h = draws(seed, B, m)
    if method == "poisson":
        return (h[:, :, None] >= poisson_thresholds()[None, None, :]).sum(axis=2).astype(np.float64)
    j = (h % np.uint64(m)).astype(np.int64)
    return np.stack([np.bincount(row, minlength=m) for row in j]).astype(np.float64)


def task_sums(rows: list[dict[str, Any]], K: int) -> dict[str, np.ndarray]:
    """Per-task sums, tasks sorted by task_id (byte order, as DuckDB sorts)."""
    tasks = sorted({r["task_id"] for r in rows})
    idx = {t: i for i, t in enumerate(tasks)}
    S = {k: np.zeros(len(tasks)) for k in ("n", "exec", "auc", "known", "succ", "elig", "rec")}
    S["pec"] = np.zeros((len(tasks), K + 1))
    for r in rows:
        i = idx[r["task_id"]]
        S["n"][i] += 1
        S["exec"][i] += r["executable"]
        S["auc"][i] += r["auc_term"]
        if r["success"] is not None:
            S["known"][i] += 1
            S["succ"][i] += r["success"]
            S["elig"][i] += not r["executable"]
            S["rec"][i] += (not r["executable"]) and r["success"]
        depth = min(r["T"], r["fed"] - 1)
        S["pec"][i, : min(depth, K) + 1] += 1
    return S


def ratios(S: dict[str, np.ndarray]) -> dict[str, Any]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "success": S["succ"] / np.where(S["known"] > 0, S["known"], np.nan),
            "ter": S["exec"] / np.where(S["n"] > 0, S["n"], np.nan),
            "auc_pec": S["auc"] / np.where(S["n"] > 0, S["n"], np.nan),
            "rr": S["rec"] / np.where(S["elig"] > 0, S["elig"], np.nan),
            "successes_after_invalid_prefix": S["rec"] / np.where(S["succ"] > 0, S["succ"], np.nan),
            "pec": S["pec"] / np.where(S["n"] > 0, S["n"], np.nan)[..., None],
        }


def percentile(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)]
    return None if values.size == 0 else float(np.quantile(values, q, method="linear"))


def numpy_intervals(rows: list[dict[str, Any]], K: int, s: BootstrapSettings) -> dict[str, Any]:
    """(value, lo, hi, method) per metric: the bootstrap, or Wilson on the effective sample size where the bootstrap
    degenerates (docs/explanation/intervals.md, "Small samples"), each computed independently of
    pipeline.core.intervals."""
    S = task_sums(rows, K)
    W = weights(s.seed, s.B, len(S["n"]), s.method)
    reps = ratios({k: W @ v for k, v in S.items()})
    full = ratios({k: v.sum(axis=0) for k, v in S.items()})
    q_lo, q_hi = (1 - s.level) / 2, 1 - (1 - s.level) / 2
    parts = {"success": ("succ", "known"), "ter": ("exec", "n"), "auc_pec": ("auc", "n"), "rr": ("rec", "elig"),
             "successes_after_invalid_prefix": ("rec", "succ")}  # fmt: skip
    out: dict[str, Any] = {}
    for m, (num, den) in parts.items():
        value = None if np.isnan(full[m]) else float(full[m])
        boot = (percentile(reps[m], q_lo), percentile(reps[m], q_hi))
        out[m] = (value, *small_sample_or(boot, value, S[num], S[den], s.level))
    out["pec"] = [(1.0, 1.0, 1.0, None)]
    for k in range(1, K + 1):
        boot = (percentile(reps["pec"][:, k], q_lo), percentile(reps["pec"][:, k], q_hi))
        value = float(full["pec"][k])
        out["pec"].append((value, *small_sample_or(boot, value, S["pec"][:, k], S["n"], s.level)))
    return out


Z95 = 1.959963984540054  # the 97.5% normal quantile


def small_sample_or(
    boot: tuple[float | None, float | None], r: float | None, y: np.ndarray, x: np.ndarray, level: float
) -> tuple[float | None, float | None, str | None]:
    """The rule of docs/explanation/intervals.md, "Small samples": the bootstrap unless r is 0 or 1, the replicates do
    not spread, or the denominator has < 30 tasks or < 30 units; else the Wilson interval (as the roots of its
    quadratic) on n_eff = X / max(1, cluster variance / binomial variance), or n_eff = tasks when r is 0 or 1."""
    if r is None:
        return None, None, None
    m, X = int((x > 0).sum()), float(x.sum())
    if 0 < r < 1 and boot[0] is not None and boot[0] < boot[1] and m >= 30 and X >= 30:
        return boot[0], boot[1], "bootstrap"
    if 0 < r < 1 and m >= 2:
        cluster_var = m / (m - 1) * ((y - r * x) ** 2).sum() / X**2
        n_eff = X / max(1.0, cluster_var / (r * (1 - r) / X))
    else:
        n_eff = m
    assert level == 0.95
    a = Z95**2 / n_eff
    lo, hi = sorted(np.roots([1 + a, -(2 * r + a), r * r]).real)  # (r - p)^2 = z^2 p (1 - p) / n_eff
    return max(lo, 0.0), min(hi, 1.0), "wilson-clustered"


def close(a: float | None, b: float | None, tol: float = 1e-12) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= tol)


@pytest.fixture(scope="module")
def cohort_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, str], list]]:
    """Four cohorts of different sizes; b2/x has exactly b1/x's task set (same draws). b1/x and b2/x have 40
    tasks (their intervals are mostly the bootstrap's), b1/y and b2/z have 7 and 2 (small samples)."""
    rng = np.random.default_rng(7)
    run = tmp_path_factory.mktemp("cohorts")
    groups = {
        ("b1", "x"): random_rows(rng, 40, 6, "b1", model="x"),
        ("b1", "y"): random_rows(rng, 7, 3, "b1", model="y"),
        ("b2", "x"): random_rows(rng, 40, 4, "b2", model="x"),
        ("b2", "z"): random_rows(rng, 2, 5, "b2", model="z"),
    }
    rows = [r for g in groups.values() for r in g]
    write_rollouts(run, rows[::2], "part-0")
    write_rollouts(run, rows[1::2], "part-1")
    return run, groups


@pytest.mark.parametrize("method", ["multinomial", "poisson"])
@pytest.mark.parametrize("seed", [0, 123456789])
def test_bootstrap_matches_numpy(cohort_run: tuple[Path, dict], method: str, seed: int) -> None:
    run, groups = cohort_run
    settings = BootstrapSettings(B=400, seed=seed, method=method)  # type: ignore[arg-type]
    cohorts = open_run(str(run)).cohorts(settings=settings, max_k=6)
    assert [(c["benchmark"], c["model"]) for c in cohorts] == sorted(groups)
    methods: set[str | None] = set()
    for c in cohorts:
        expected = numpy_intervals(groups[(c["benchmark"], c["model"])], 6, settings)
        for m in ("success", "ter", "auc_pec", "rr", "successes_after_invalid_prefix"):
            got = (c[m]["value"], c[m]["lo"], c[m]["hi"])
            tol = 1e-12 if expected[m][3] == "bootstrap" else 1e-9  # Wilson: closed form vs polynomial roots
            assert all(close(a, b, tol) for a, b in zip(got, expected[m][:3], strict=True)), (c["benchmark"], m, got)
            assert c[m].get("method") == expected[m][3]
            methods.add(expected[m][3])
        assert [p["k"] for p in c["pec"]] == list(range(7))
        for p, exp in zip(c["pec"], expected["pec"], strict=True):
            assert all(close(a, b, 1e-9) for a, b in zip((p["value"], p["lo"], p["hi"]), exp[:3], strict=True))
            assert p.get("method") == exp[3]
        assert c["bootstrap"] == {
            "B": 400,
            "seed": seed,
            "method": method,
            "level": 0.95,
            "unit": "task",
            "duckdb_version": duckdb.__version__,
        }
    assert {"bootstrap", "wilson-clustered"} <= methods  # both rules are exercised


def test_same_task_set_gets_same_draws() -> None:
    # The draw depends on (seed, b, i, m) only: cohorts b1/x and b2/x (23 tasks each) share W.
    assert np.array_equal(weights(0, 50, 23, "multinomial"), weights(0, 50, 23, "multinomial"))
    W = weights(0, 1000, 23, "multinomial")
    assert (W.sum(axis=1) == 23).all()  # m draws per replicate
    assert abs(W.mean() - 1) < 1e-12 and 0.9 < W.var() < 1.1  # multinomial(m, 1/m): variance 1 - 1/m
    P = weights(0, 1000, 23, "poisson")
    assert abs(P.mean() - 1) < 0.03 and abs(P.var() - 1) < 0.08


def test_multinomial_close_to_rng_bootstrap(tmp_path: Path) -> None:
    """Our hashed draws behave like a real random resampling of tasks.

    200 tasks x 5 rollouts with strong within-task correlation. Reference: numpy default_rng task
    bootstrap, B = 20000, on the same per-task sums. Each 2.5%/97.5% endpoint estimated from B replicates
    has a Monte-Carlo standard error of about sd * sqrt(q(1-q)/B) / phi(1.96) = 2.67 sd / sqrt(B), i.e.
    0.060 sd for our B = 2000 and 0.019 sd for the reference: tolerance 0.3 sd is ~4.8 standard errors of
    the difference. A rollout-level bootstrap (the wrong unit) would be ~40% narrower and must fail it.
    """
    rng = np.random.default_rng(11)
    rows = []
    for t in range(200):
        p = rng.beta(0.3, 0.3)
        rows += [rollout(f"t{t:03d}", 4, 5, bool(rng.random() < p)) for _ in range(5)]
    write_rollouts(tmp_path, rows)
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=2000, seed=3))

    S = task_sums(rows, 0)
    idx = rng.integers(0, 200, size=(20000, 200))
    boot = S["succ"][idx].sum(axis=1) / S["known"][idx].sum(axis=1)
    sd = boot.std()
    lo, hi = np.quantile(boot, [0.025, 0.975])
    tol = 0.3 * sd
    assert abs(c["success"]["lo"] - lo) < tol and abs(c["success"]["hi"] - hi) < tol
    # The same check would catch resampling rollouts instead of tasks.
    flat = np.array([r["success"] for r in rows], dtype=float)
    wrong = flat[rng.integers(0, flat.size, size=(2000, flat.size))].mean(axis=1)
    wrong_lo, wrong_hi = np.quantile(wrong, [0.025, 0.975])
    assert abs(wrong_lo - lo) > tol and abs(wrong_hi - hi) > tol


# --- determinism --------------------------------------------------------------------------------------


def test_deterministic_and_seed_sensitive(cohort_run: tuple[Path, dict]) -> None:
    run, _ = cohort_run
    a = open_run(str(run)).cohorts(settings=BootstrapSettings(B=300, seed=5))
    b = open_run(str(run)).cohorts(settings=BootstrapSettings(B=300, seed=5))
    assert a == b
    c = open_run(str(run)).cohorts(settings=BootstrapSettings(B=300, seed=6))
    bounds = lambda cs: [(x[m]["lo"], x[m]["hi"]) for x in cs for m in ("success", "ter", "auc_pec")]  # noqa: E731
    assert bounds(a) != bounds(c)
    assert [x["success"]["value"] for x in a] == [x["success"]["value"] for x in c]  # point estimates: full data


def test_the_metrics_table_is_the_cohorts_flattened(cohort_run: tuple[Path, dict]) -> None:
    """`Run.metrics` (what a notebook takes) is `Run.cohorts` as one Arrow row per cohort: the same values and
    bounds; `bootstrap` is B or the settings, `seed` overrides the seed."""
    run = open_run(str(cohort_run[0]))
    cohorts = run.cohorts(["model"], BootstrapSettings(B=60, seed=4))
    table = run.metrics(by=["model"], bootstrap=60, seed=4)
    assert isinstance(table, pa.Table) and table.num_rows == len(cohorts) > 1
    for row, c in zip(table.to_pylist(), cohorts, strict=True):
        assert (row["benchmark"], row["model"], row["n"]) == (c["benchmark"], c["model"], c["n"])
        for m in ("ter", "auc_pec", "rr", "success"):
            assert (row[m], row[f"{m}_lo"], row[f"{m}_hi"]) == (c[m]["value"], c[m]["lo"], c[m]["hi"])
        assert (row["bootstrap_B"], row["bootstrap_seed"]) == (60, 4)
    assert run.metrics(by=["model"], bootstrap=BootstrapSettings(B=60, seed=4)) == table
    assert run.metrics(by=["model"], bootstrap=60, seed=5) != table  # another seed, other bounds
    pec = run.pec(by=["model"], bootstrap=60, seed=4)
    assert pec.num_rows == sum(len(c["pec"]) for c in cohorts)
    assert pec.filter(pc.equal(pec["k"], 0))["value"].to_pylist() == [1.0] * len(cohorts)


def test_write_metrics_is_rerun_safe(cohort_run: tuple[Path, dict], tmp_path: Path) -> None:
    run, _ = cohort_run
    cohorts = open_run(str(run)).cohorts(settings=BootstrapSettings(B=100))
    folder = run / "metrics" / "metrics"  # the default cohorts (every label) are kept as `metrics`
    assert open_run(str(run)).write_metrics(cohorts) == str(folder)
    first = (folder / "metrics.parquet").read_bytes(), (folder / "pec.parquet").read_bytes()
    open_run(str(run)).write_metrics(open_run(str(run)).cohorts(settings=BootstrapSettings(B=100)))
    assert ((folder / "metrics.parquet").read_bytes(), (folder / "pec.parquet").read_bytes()) == first
    table = pq.read_table(folder / "metrics.parquet").to_pylist()
    assert len(table) == len(cohorts) == 4
    assert table[0]["benchmark"] == "b1" and table[0]["model"] == "x"
    assert table[0]["ter"] == cohorts[0]["ter"]["value"] and table[0]["rr_eligible"] == cohorts[0]["rr"]["eligible"]
    assert table[0]["bootstrap_method"] == "multinomial" and table[0]["duckdb_version"] == duckdb.__version__
    assert (table[0]["partial"], table[0]["partial_shards"]) == (False, None)  # a complete run
    pec = pq.read_table(folder / "pec.parquet")
    assert pec.num_rows == sum(len(c["pec"]) for c in cohorts)
    assert not list(folder.glob("*.tmp"))


# --- cohorts, NULLs, edge cases -------------------------------------------------------------------------


def grouped_rows() -> list[dict[str, Any]]:
    rows = []
    for i, (bench, model, method) in enumerate(
        [("b1", "m1", "react"), ("b1", "m1", "plan"), ("b1", "m2", "react"), ("b2", "m1", "react")] * 3
    ):
        rows.append(rollout(f"t{i % 5}", 2, 3 if i % 2 else 1, i % 3 == 0, bench, model=model, method=method))
    return rows


def test_by_grouping(tmp_path: Path) -> None:
    write_rollouts(tmp_path, grouped_rows())
    all_labels = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=50))
    assert [(c["benchmark"], c["model"], c["method"], c["n"]) for c in all_labels] == [
        ("b1", "m1", "plan", 3),
        ("b1", "m1", "react", 3),
        ("b1", "m2", "react", 3),
        ("b2", "m1", "react", 3),
    ]
    by_model = open_run(str(tmp_path)).cohorts(["model"], BootstrapSettings(B=50))
    assert [(c["benchmark"], c["model"], c["n"]) for c in by_model] == [
        ("b1", "m1", 6),
        ("b1", "m2", 3),
        ("b2", "m1", 3),
    ]
    assert "method" not in by_model[0]
    only_bench = open_run(str(tmp_path)).cohorts([], BootstrapSettings(B=50))
    assert [(c["benchmark"], c["n"]) for c in only_bench] == [("b1", 9), ("b2", 3)]
    ordered = open_run(str(tmp_path)).cohorts(["method", "model"], BootstrapSettings(B=50))
    assert list(ordered[0])[:3] == ["benchmark", "method", "model"]


def test_unknown_by_column(tmp_path: Path) -> None:
    write_rollouts(tmp_path, grouped_rows())
    with pytest.raises(ValueError, match=r"unknown cohort column 'agent'.*available label columns: model, method"):
        open_run(str(tmp_path)).cohorts(["agent"])
    with pytest.raises(ValueError, match="T"):  # a fixed column is not a label
        open_run(str(tmp_path)).cohorts(["T"])


def test_labels_differ_between_parts(tmp_path: Path) -> None:
    write_rollouts(tmp_path, [rollout("t1", 1, 2, True, model="m1")], "part-0")
    write_rollouts(tmp_path, [rollout("t1", 1, 1, False, model="m1", method="react")], "part-1")
    cohorts = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=20))
    assert [(c["model"], c["method"], c["n"]) for c in cohorts] == [("m1", "react", 1), ("m1", None, 1)]
    assert open_run(str(tmp_path)).cohorts(["model"], BootstrapSettings(B=20))[0]["n"] == 2


def test_null_success(tmp_path: Path) -> None:
    rows = [
        rollout("t1", 2, 3, True),
        rollout("t1", 2, 1, True),
        rollout("t2", 2, 2, None),  # invalid prefix, no verdict: not RR-eligible
        rollout("t2", 2, 3, None),
        rollout("t3", 3, 1, False),
    ]
    write_rollouts(tmp_path, rows)
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=200))
    assert c["success"]["value"] == 2 / 3  # over the 3 rollouts with a verdict
    assert c["ter"]["value"] == 2 / 5  # over all 5
    assert c["rr"]["eligible"] == 2 and c["rr"]["value"] == 1 / 2
    assert c["successes_after_invalid_prefix"]["value"] == 1 / 2


def test_all_success_null(tmp_path: Path) -> None:
    write_rollouts(tmp_path, [rollout("t1", 2, 1, None), rollout("t2", 1, 2, None)])
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=50))
    assert c["success"] == {"value": None, "lo": None, "hi": None}
    assert c["rr"] == {"value": None, "lo": None, "hi": None, "eligible": 0}
    assert c["ter"]["value"] == 0.5


def test_rr_without_eligible_rollouts(tmp_path: Path) -> None:
    rows = [
        rollout("t1", 2, 1, True, model="bad"),
        rollout("t2", 3, 4, True, model="good"),
        rollout("t3", 0, 1, False, model="good"),
    ]
    write_rollouts(tmp_path, rows)
    bad, good = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=100))
    assert good["model"] == "good"
    assert good["rr"] == {"value": None, "lo": None, "hi": None, "eligible": 0}
    assert good["successes_after_invalid_prefix"]["value"] == 0.0
    assert bad["rr"]["eligible"] == 1 and bad["rr"]["value"] == 1.0


def test_no_call_rollouts_and_pec_by_hand(tmp_path: Path) -> None:
    # (T, FED): depth min(T, FED - 1) = 0, 2, 1, 0, 4
    rows = [rollout(f"t{i}", T, fed, True) for i, (T, fed) in enumerate([(0, 1), (2, 3), (3, 2), (5, 1), (4, 5)])]
    write_rollouts(tmp_path, rows)
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=100))
    assert c["n_no_calls"] == 1
    assert c["ter"]["value"] == 3 / 5  # T = 0 counts as executable
    assert abs(c["auc_pec"]["value"] - (1 + 1 + 1 / 3 + 0 + 1) / 5) < 1e-12  # auc_term = 1 for T = 0
    assert [p["k"] for p in c["pec"]] == [0, 1, 2, 3, 4, 5]  # K = max T
    assert [p["value"] for p in c["pec"]] == [1.0, 3 / 5, 2 / 5, 1 / 5, 1 / 5, 0.0]
    assert c["pec"][0] == {"k": 0, "value": 1.0, "lo": 1.0, "hi": 1.0}
    short = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=10), max_k=2)[0]["pec"]
    assert [p["value"] for p in short] == [1.0, 3 / 5, 2 / 5]


def test_k_capped_at_20(tmp_path: Path) -> None:
    write_rollouts(tmp_path, [rollout("t1", 30, 31, True), rollout("t2", 0, 1, True)])
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=10))
    assert [p["k"] for p in c["pec"]] == list(range(21))
    assert c["pec"][20]["value"] == 0.5
    assert len(open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=10), max_k=25)[0]["pec"]) == 26


def test_only_no_call_rollouts(tmp_path: Path) -> None:
    write_rollouts(tmp_path, [rollout("t1", 0, 1, True), rollout("t2", 0, 1, False)])
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=10, method="poisson"))
    # K is at least the table's depths: every rollout ended before depth 1, so PEC(1..3) is 0, not missing.
    assert c["pec"][0] == {"k": 0, "value": 1.0, "lo": 1.0, "hi": 1.0}
    assert [(p["k"], p["value"]) for p in c["pec"][1:]] == [(1, 0.0), (2, 0.0), (3, 0.0)]
    assert c["auc_pec"]["value"] == 1.0 and c["n_no_calls"] == 2


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_run(str(tmp_path / "missing")).cohorts()
    with pytest.raises(ValueError):
        BootstrapSettings(method="bayes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BootstrapSettings(seed=-1)
    with pytest.raises(ValueError):
        BootstrapSettings(B=0)


# --- sql() ----------------------------------------------------------------------------------------------


@pytest.fixture()
def sql_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    write_rollouts(run, paper_rows())
    write_steps(run, 12)
    (tmp_path / "outside.csv").write_text("a\n1\n")
    return run


def test_sql_views(sql_run: Path) -> None:
    assert open_run(str(sql_run)).sql("SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": 200}]
    assert open_run(str(sql_run)).sql("SELECT count(*) AS n FROM steps WHERE valid").to_pylist() == [{"n": 8}]
    assert open_run(str(sql_run)).sql(
        "WITH s AS (SELECT sum(success::INT) AS k FROM rollouts) SELECT k FROM s"
    ).to_pylist() == [{"k": 148}]
    assert open_run(str(sql_run)).sql("SELECT 1 AS a; SELECT 2 AS b").to_pylist() == [{"b": 2}]
    assert open_run(str(sql_run)).sql("EXPLAIN SELECT * FROM rollouts").num_rows >= 1
    with pytest.raises(QueryError, match=r"Catalog Error: .*metrics does not exist"):
        open_run(str(sql_run)).sql("SELECT * FROM metrics")  # not written yet
    open_run(str(sql_run)).write_metrics(open_run(str(sql_run)).cohorts(settings=BootstrapSettings(B=50)))
    assert open_run(str(sql_run)).sql("SELECT benchmark, ter, rr_eligible FROM metrics").to_pylist() == [
        {"benchmark": "bench", "ter": 0.05, "rr_eligible": 190}
    ]
    assert open_run(str(sql_run)).sql("SELECT count(*) AS n FROM pec").to_pylist() == [{"n": 5}]  # k = 0..4


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO rollouts SELECT * FROM rollouts",
        "CREATE TABLE x AS SELECT 1",
        "COPY (SELECT * FROM rollouts) TO 'out.csv'",
        "ATTACH 'other.db'",
        "DROP VIEW rollouts",
        "UPDATE rollouts SET success = true",
        "DELETE FROM rollouts",
        "SELECT 1; DROP VIEW rollouts",
        "SET threads = 1",
        "PRAGMA version",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CALL pragma_version()",
        "EXPLAIN CREATE TABLE x (a INT)",
        "SET VARIABLE rollouts_glob = '/etc/*'",
        "",
    ],
)
def test_sql_refuses_writes(sql_run: Path, query: str) -> None:
    with pytest.raises(QueryRefused):
        open_run(str(sql_run)).sql(query)
    assert not (Path.cwd() / "out.csv").exists()


def test_sql_cannot_read_outside_the_run(sql_run: Path) -> None:
    with pytest.raises(QueryError, match="Permission Error"):
        open_run(str(sql_run)).sql(f"SELECT * FROM read_csv('{sql_run.parent / 'outside.csv'}')")


def test_interval_level(cohort_run: tuple[Path, dict]) -> None:
    run, _ = cohort_run
    wide = open_run(str(run)).cohorts(settings=BootstrapSettings(B=300, level=0.99))[0]
    narrow = open_run(str(run)).cohorts(settings=BootstrapSettings(B=300, level=0.5))[0]
    assert wide["bootstrap"]["level"] == 0.99
    for m in ("success", "ter"):
        assert wide[m]["lo"] <= narrow[m]["lo"] <= narrow[m]["hi"] <= wide[m]["hi"]
        assert math.isclose(wide[m]["value"], narrow[m]["value"])


def test_sql_hash_and_poisson_table_match_numpy() -> None:
    from pipeline.metrics.duck import run_sql

    con = duckdb.connect()
    run_sql(con, "metrics/hash")
    rng = np.random.default_rng(1)
    xs = np.concatenate([np.arange(3000), rng.integers(0, 2**32, 20000), [2**32 - 1]]).astype(np.uint64)
    got = con.execute(
        "SELECT list(pexec_lb32(x::UBIGINT) ORDER BY i) FROM unnest(?) WITH ORDINALITY t(x, i)", [xs.tolist()]
    )
    assert np.array_equal(np.array(got.fetchone()[0], dtype=np.uint64), lb32(xs))
    # Every step of the Poisson(1) table, on both sides of each threshold.
    T = poisson_thresholds()
    assert len(T) == 12
    hs = np.concatenate([T - np.uint64(1), T, [0, 2**32 - 1]]).astype(np.uint64)
    got = con.execute(
        "SELECT list(pexec_poisson1(h::UBIGINT) ORDER BY i) FROM unnest(?) WITH ORDINALITY t(h, i)", [hs.tolist()]
    )
    expected = (hs[:, None] >= T[None, :]).sum(axis=1)
    assert got.fetchone()[0] == expected.tolist()
    assert expected.tolist()[:12] == list(range(12)) and expected.tolist()[12:24] == list(range(1, 13))
    # Whole draws: h(seed, b, i) for a few replicates.
    got = con.execute(
        "SELECT list(pexec_draw(pexec_rep_key(?, b), pexec_lb32(i::UBIGINT)) ORDER BY b, i)"
        " FROM range(5) r(b), range(7) s(i)",
        [987654321],
    )
    assert got.fetchone()[0] == draws(987654321, 5, 7).ravel().tolist()


# --- small samples: never a zero-width interval (docs/explanation/intervals.md, "Small samples")
# -----------------------------------


@pytest.mark.parametrize(("recovered", "bound"), [(False, "hi"), (True, "lo")])
def test_rr_at_0_or_1_on_12_independent_tasks(tmp_path: Path, recovered: bool, bound: str) -> None:
    """12 tasks with one RR-eligible rollout each: 0/12 has an upper bound >= 0.24 (Wilson: z^2 / (12 + z^2) =
    0.2425), 12/12 a lower bound <= 0.76, never the bootstrap's [0, 0] or [1, 1]."""
    write_rollouts(tmp_path, [rollout(f"t{i:02d}", 3, 2, recovered) for i in range(12)])
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=200))
    rr = c["rr"]
    assert (rr["eligible"], rr["method"]) == (12, "wilson-clustered")
    z2 = 1.959963984540054**2
    if bound == "hi":
        assert rr["value"] == 0.0 and rr["lo"] == 0.0 and rr["hi"] >= 0.24
        assert math.isclose(rr["hi"], z2 / (12 + z2), rel_tol=1e-12)
    else:
        assert rr["value"] == 1.0 and rr["hi"] == 1.0 and rr["lo"] <= 0.76
        assert math.isclose(rr["lo"], 12 / (12 + z2), rel_tol=1e-12)
    assert c["ter"]["value"] == 0.0 and c["ter"]["hi"] >= 0.24  # TER = 0/12 too
    table = CliRunner().invoke(app, ["metrics", str(tmp_path), "--bootstrap", "50"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert f"{rr['value']:.3f} †" in text and f"{rr['lo']:.3f}–{rr['hi']:.3f}" in text  # value and interval cell
    assert "† Wilson score interval" in text


def test_rr_on_one_task_counts_one_unit(tmp_path: Path) -> None:
    """Three RR-eligible rollouts of one task: RR = 1 rests on one task, so n_eff = 1 (bound z^2 / (1 + z^2))."""
    write_rollouts(tmp_path, [rollout("t1", 2, 1, True) for _ in range(3)] + [rollout("t2", 2, 3, True)])
    [c] = open_run(str(tmp_path)).cohorts(settings=BootstrapSettings(B=100))
    z2 = 1.959963984540054**2
    assert c["rr"]["value"] == 1.0 and math.isclose(c["rr"]["lo"], 1 / (1 + z2), rel_tol=1e-12)
    for m in ("success", "ter", "auc_pec", "rr", "successes_after_invalid_prefix"):
        assert c[m]["lo"] < c[m]["hi"], m  # never zero-width
    assert all(p["lo"] < p["hi"] for p in c["pec"][1:])
