"""Benchmark of the metrics stage (docs/explanation/measured-facts.md): compute_metrics on a synthetic rollouts table,
against a plain-numpy reference that reproduces its multinomial bounds, measured interleaved in the same run; and
the peak memory of compute_metrics at N and 10 N rollouts over the same tasks and cohorts, which is flat when the
rollouts are summed per (cohort, task) as they are read.

    python -m pipeline.apps.perf.metrics [--rollouts N] [--tasks M] [-B B] [--cohorts 1,16] [--memory-cohorts 4]
        [--memory-scale 10] [--repeats R] [--workdir DIR]

Each measurement runs in a fresh process (spawned: a new program), so the peak it reports, its VmHWM, is its own.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pyarrow.parquet as pq

from pipeline.apps.perf._fixtures import commit_parts
from pipeline.apps.perf.figures import Bench, Figure, figure, load_average, n_runs, show
from pipeline.core.arrow import pa
from pipeline.scoring.memory import peak_mib

if TYPE_CHECKING:
    from pipeline.metrics.results import Cohort
    from pipeline.metrics.settings import Method

Bounds = dict[str, dict[str, tuple[float, float]]]  # model -> metric -> (lo, hi)


class MetricsRun(TypedDict):
    """What `details` keeps per number of cohorts: seconds and peak RSS (VmHWM) per method, and whether the
    reference's bounds equal the project's."""

    seconds: dict[str, list[float]]
    peak_rss_mib: dict[str, list[float]]
    same_bounds: bool


class MemoryRun(TypedDict):
    """What `details` keeps per run size of the memory rows: wall and CPU seconds and VmHWM of the project
    (multinomial) and of the reference."""

    rollouts: int
    seconds: dict[str, list[float]]
    cpu_seconds: dict[str, list[float]]
    peak_rss_mib: dict[str, list[float]]


def write_synthetic_rollouts(
    run: Path, n_rollouts: int, n_tasks: int, seed: int = 0, parts: int = 4, n_models: int = 1, max_t: int = 15
) -> None:
    """A rollouts table shaped like a real run: T in 0..max_t, ~20% executable, success tied to both.

    With n_models > 1 every rollout gets a random `model` label: that many cohorts over the same tasks.
    """
    rng = np.random.default_rng(seed)
    task = rng.integers(0, n_tasks, n_rollouts)
    # Per-task difficulty drives both executability and success (within-task correlation, as in real runs).
    hard = rng.beta(2, 2, n_tasks)[task]
    T = rng.integers(0, max_t + 1, n_rollouts).astype(np.int32)
    exec_p = np.clip(0.4 - 0.4 * hard, 0.0, 1.0)  # mean ~0.2
    executable = (T == 0) | (rng.random(n_rollouts) < exec_p)
    fed = np.where(executable, T + 1, 1 + np.floor(rng.random(n_rollouts) * np.maximum(T, 1))).astype(np.int32)
    auc = np.where(T == 0, 1.0, (fed - 1) / np.maximum(T, 1))
    success_p = np.where(executable, 0.9 - 0.3 * hard, 0.75 - 0.5 * hard)
    success = rng.random(n_rollouts) < success_p
    success_known = rng.random(n_rollouts) >= 0.01  # 1% of logs carry no verdict
    success_arr = pa.array(success, mask=~success_known)
    recovered = pa.array(~executable & success, mask=~success_known)
    n_invalid = np.where(executable, 0, 1 + (rng.random(n_rollouts) * np.maximum(T - fed, 0)).astype(np.int32))
    causes = np.array(["schema", "dependency", "information", "state_consistency", "precondition"])
    first_cause = pa.array(causes[rng.integers(0, 5, n_rollouts)], mask=executable)
    task_ids = np.char.add("task-", np.char.zfill(task.astype(str), 6))
    table = pa.table(
        {
            "run_id": pa.array(["bench"] * n_rollouts),
            "rollout_id": pa.array(np.char.add("r", np.arange(n_rollouts).astype(str))),
            "task_id": pa.array(task_ids),
            "benchmark": pa.array(["synthetic"] * n_rollouts),
            "model": pa.array(np.char.add("model-", rng.integers(0, n_models, n_rollouts).astype(str))),
            "status": pa.array(["ok"] * n_rollouts),  # no harness errors
            "T": pa.array(T),
            "fed": pa.array(fed),
            "executable": pa.array(executable),
            "auc_term": pa.array(auc),
            "success": success_arr,
            "recovered": recovered,
            "first_cause": first_cause,
            "n_invalid": pa.array(n_invalid.astype(np.int32)),
            "n_output_mismatch": pa.array(np.zeros(n_rollouts, np.int32)),
            "n_output_compared": pa.array(T),
            "diverged_before_fed": pa.array(np.zeros(n_rollouts, bool)),
            "cost_tokens": pa.array(rng.gamma(2.0, 500.0, n_rollouts)),
        }
    )
    folder = run / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-n_rollouts // parts)
    for i in range(parts):
        pq.write_table(table.slice(i * step, step), folder / f"part-{i:04d}.parquet")
    commit_parts(str(run))


def reference_bounds(run: str, B: int, seed: int = 0, level: float = 0.95) -> Bounds:
    """The plain-numpy reference the project is timed against: read the rollouts with pyarrow, sum per (model,
    task), draw the same multinomial weights (metrics/sql/hash.sql in uint64 numpy, one replicate at a time), take the
    replicates' TER, AUC-PEC, success and RR and their percentile bounds. model -> metric -> (lo, hi)."""
    cols = ["task_id", "model", "T", "executable", "auc_term", "success"]
    table = pq.read_table(Path(run) / "rollouts", columns=cols)
    model = table["model"].to_numpy(zero_copy_only=False).astype(str)
    task = table["task_id"].to_numpy(zero_copy_only=False).astype(str)
    known = table["success"].is_valid().to_numpy(zero_copy_only=False)
    success = table["success"].fill_null(False).to_numpy(zero_copy_only=False)
    executable = table["executable"].to_numpy(zero_copy_only=False)
    parts = {
        "n": np.ones(len(task), np.int64),
        "exec": executable.astype(np.int64),
        "auc": np.round(table["auc_term"].to_numpy() * 2.0**40).astype(np.int64),
        "known": known.astype(np.int64),
        "succ": (success & known).astype(np.int64),
        "elig": (~executable & known).astype(np.int64),
        "rec": (~executable & success & known).astype(np.int64),
    }
    ratios = {"ter": ("exec", "n", 1.0), "auc_pec": ("auc", "n", 2.0**40), "success": ("succ", "known", 1.0),
              "rr": ("rec", "elig", 1.0)}  # fmt: skip
    mask = np.uint64(0xFFFFFFFF)

    def lb32(x: np.ndarray) -> np.ndarray:
        x = x ^ (x >> np.uint64(16))
        x = (x * np.uint64(0x7FEB352D)) & mask
        x = x ^ (x >> np.uint64(15))
        x = (x * np.uint64(0x846CA68B)) & mask
        return x ^ (x >> np.uint64(16))

    keys = lb32(lb32(np.asarray(seed, dtype=np.uint64)) ^ np.arange(B, dtype=np.uint64))
    out: Bounds = {}
    for name in np.unique(model):
        rows = model == name
        tasks, inverse = np.unique(task[rows], return_inverse=True)  # task_id order, as the project numbers them
        m = len(tasks)
        S = np.zeros((m, len(parts)), np.int64)
        for j, values in enumerate(parts.values()):
            np.add.at(S[:, j], inverse, values[rows])
        mixed = lb32(np.arange(m, dtype=np.uint64))
        reps = np.empty((B, len(parts)), np.int64)
        for b in range(B):
            counts = np.bincount((lb32(keys[b] ^ mixed) % np.uint64(m)).astype(np.int64), minlength=m)
            reps[b] = counts @ S
        index = {p: j for j, p in enumerate(parts)}
        alpha = (1 - level) / 2
        out[str(name)] = {}
        for metric, (num, den, scale) in ratios.items():
            with np.errstate(divide="ignore", invalid="ignore"):
                values = reps[:, index[num]] / reps[:, index[den]] / scale
            values = values[np.isfinite(values)]
            lo, hi = np.quantile(values, [alpha, 1 - alpha], method="linear")
            out[str(name)][metric] = (float(lo), float(hi))
    return out


class Measured(TypedDict):
    """One measurement in a fresh process: wall and CPU seconds, and the process's own peak (VmHWM)."""

    seconds: float
    cpu_seconds: float
    peak_mib: float


def _time_project(run: str, method: Method, B: int, max_k: int) -> tuple[Measured, dict[str | None, Cohort]]:
    from pipeline.metrics.results import key_values
    from pipeline.metrics.run import open_run
    from pipeline.metrics.settings import BootstrapSettings

    start, cpu = time.perf_counter(), time.process_time()
    cohorts = open_run(run).cohorts(None, BootstrapSettings(B=B, method=method), max_k=max_k)
    measured = _measured(start, cpu)
    return measured, {key_values(c, ["model"])[0]: c for c in cohorts}


def _time_reference(run: str, B: int) -> tuple[Measured, Bounds]:
    start, cpu = time.perf_counter(), time.process_time()
    bounds = reference_bounds(run, B)
    return _measured(start, cpu), bounds


def _measured(start: float, cpu: float) -> Measured:
    # process_time counts this process's threads (DuckDB's and numpy's), not a child's.
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "peak_mib": peak_mib()}


def bench_metrics(
    n_rollouts: int = 1_000_000,
    n_tasks: int = 100_000,
    B: int = 1000,
    workdir: str | Path | None = None,
    max_k: int = 10,
    cohorts: tuple[int, ...] = (1, 16),
    repeats: int = 3,
    memory_cohorts: int = 4,
    memory_scale: int = 10,
) -> Bench:
    """Time compute_metrics (both methods) against the plain-numpy reference, interleaved in the same run
    (a fresh process per measurement, so each peak RSS is its own), for each number of model cohorts over the
    same tasks; checks that the reference reproduces the project's multinomial bounds. Then the peak memory of
    compute_metrics (multinomial) and of the reference over `memory_cohorts` cohorts at `n_rollouts` and
    `memory_scale` times as many rollouts over the same tasks (memory_scale 1: no such rows)."""
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="pexec-bench-metrics-"))
    load = os.getloadavg()[0]
    ctx = multiprocessing.get_context("spawn")
    figures: list[Figure] = []
    details: dict[str, MetricsRun | list[MemoryRun]] = {}
    for n_models in cohorts:
        run = base / f"run-{n_models}"
        if run.exists():
            shutil.rmtree(run)
        write_synthetic_rollouts(run, n_rollouts, n_tasks, n_models=n_models)
        times: dict[str, list[float]] = {"multinomial": [], "poisson": [], "reference": []}
        peak: dict[str, list[float]] = {"multinomial": [], "poisson": [], "reference": []}
        same = True
        for _ in range(repeats):
            for method in ("multinomial", "poisson"):
                with ctx.Pool(1) as pool:
                    measured, project = pool.apply(_time_project, (str(run), method, B, max_k))
                times[method].append(measured["seconds"])
                peak[method].append(measured["peak_mib"])
                if method == "multinomial":
                    mine = project
            with ctx.Pool(1) as pool:
                measured, bounds = pool.apply(_time_reference, (str(run), B))
            times["reference"].append(measured["seconds"])
            peak["reference"].append(measured["peak_mib"])
            # Same to 1e-12: numpy and DuckDB interpolate between the same two order statistics with formulas
            # that can differ in the last bit.
            same &= all(
                got is not None and math.isclose(got, bound, rel_tol=1e-12, abs_tol=1e-15)
                for name, per_metric in bounds.items()
                for metric, lo_hi in per_metric.items()
                for got, bound in zip(_bounds(mine[name], metric), lo_hi, strict=True)
            )
        details[f"{n_models}_cohorts"] = {"seconds": times, "peak_rss_mib": peak, "same_bounds": same}
        each = n_tasks * -math.expm1(-n_rollouts / n_models / n_tasks)  # expected distinct tasks per cohort
        who = f"{n_models} cohort{'s' if n_models > 1 else ''} (≈ {each:,.0f} tasks each)"
        reference = f"numpy reference, bounds {'equal' if same else 'DIFFERENT'}"
        figures += [
            figure(f"{who}: compute_metrics, multinomial", "s", times["multinomial"], reference, times["reference"]),
            figure(f"{who}: compute_metrics, Poisson", "s", times["poisson"], reference, times["reference"]),
            figure(f"{who}: peak RSS, multinomial", "MiB", peak["multinomial"], "numpy reference", peak["reference"]),
        ]
        if workdir is None:
            shutil.rmtree(run, ignore_errors=True)
    if memory_scale > 1:
        memory_figures, memory_details = _memory_rows(base, n_rollouts, n_tasks, B, max_k, memory_cohorts,
                                                      memory_scale, repeats)  # fmt: skip
        figures += memory_figures
        details["memory"] = memory_details
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    sizes = f"{n_rollouts:,} rollouts" + (f" (and {n_rollouts * memory_scale:,})" if memory_scale > 1 else "")
    caption = (
        f"{sizes}, {n_tasks:,} tasks, B = {B}, K = {max_k}; each measurement in a fresh process, "
        f"project and reference interleaved, {n_runs(repeats)}; {load_average(load)}"
    )
    return Bench("metrics", caption, figures, details)


def _memory_rows(
    base: Path, n_rollouts: int, n_tasks: int, B: int, max_k: int, n_models: int, scale: int, repeats: int
) -> tuple[list[Figure], list[MemoryRun]]:
    """Peak memory (VmHWM) and seconds of compute_metrics and of the reference at n_rollouts and scale times as
    many over the same tasks and cohorts; then the peak of the larger over the smaller: about 1 when memory grows
    with tasks x cohorts, not with rollouts (the reference holds every rollout)."""
    ctx = multiprocessing.get_context("spawn")
    figures: list[Figure] = []
    runs: list[MemoryRun] = []
    for size in (n_rollouts, n_rollouts * scale):
        run = base / f"memory-{size}"
        if run.exists():
            shutil.rmtree(run)
        write_synthetic_rollouts(run, size, n_tasks, parts=max(4, -(-size // 250_000)), n_models=n_models)
        measured: dict[str, list[Measured]] = {"project": [], "reference": []}
        for _ in range(repeats):
            with ctx.Pool(1) as pool:
                measured["project"].append(pool.apply(_time_project, (str(run), "multinomial", B, max_k))[0])
            with ctx.Pool(1) as pool:
                measured["reference"].append(pool.apply(_time_reference, (str(run), B))[0])
        shutil.rmtree(run, ignore_errors=True)
        got: MemoryRun = {
            "rollouts": size,
            "seconds": {k: [m["seconds"] for m in v] for k, v in measured.items()},
            "cpu_seconds": {k: [m["cpu_seconds"] for m in v] for k, v in measured.items()},
            "peak_rss_mib": {k: [m["peak_mib"] for m in v] for k, v in measured.items()},
        }
        runs.append(got)
        who = f"{n_models} cohorts over {n_tasks:,} tasks, {size:,} rollouts"
        reference = "numpy reference, every rollout in memory"
        peaks, cpu = got["peak_rss_mib"], got["cpu_seconds"]
        figures += [
            figure(f"{who}: peak RSS (VmHWM) of compute_metrics", "MiB", peaks["project"], reference,
                   peaks["reference"]),
            figure(f"{who}: CPU seconds of compute_metrics", "CPU s", cpu["project"], reference, cpu["reference"]),
        ]  # fmt: skip
    small, large = (r["peak_rss_mib"] for r in runs)
    growth = {k: [b / a for a, b in zip(small[k], large[k], strict=True)] for k in small}
    figures.append(
        figure(
            f"peak RSS, {n_rollouts * scale:,} over {n_rollouts:,} rollouts, same tasks × cohorts (target ≤ 1.1)",
            "×",
            growth["project"],
            "numpy reference, every rollout in memory",
            growth["reference"],
        )
    )
    return figures, runs


def _bounds(cohort: Cohort, metric: str) -> tuple[float | None, float | None]:
    from pipeline.metrics.results import ratio

    value = ratio(cohort, metric)
    return value["lo"], value["hi"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("-B", type=int, default=1000)
    parser.add_argument("--max-k", type=int, default=10)
    parser.add_argument("--cohorts", default="1,16", help="model cohorts over the same tasks, comma-separated")
    parser.add_argument("--memory-cohorts", type=int, default=4, help="model cohorts of the memory rows")
    parser.add_argument("--memory-scale", type=int, default=10, help="the memory rows' larger run, in --rollouts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    cohorts = tuple(int(c) for c in args.cohorts.split(","))
    sizes = (args.rollouts, args.tasks, args.B, args.workdir, args.max_k, cohorts, args.repeats)
    show(bench_metrics(*sizes, args.memory_cohorts, args.memory_scale))


if __name__ == "__main__":
    main()
