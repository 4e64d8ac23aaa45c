"""Benchmark of `pexec view`'s pages on a large run (docs/design.md §7): the synthetic rollouts table of
pipeline.perf.metrics plus its steps, served by the real app, each page timed end to end (query + template).
Run it as `pexec bench view [--rollouts N] [--workdir DIR]`.
"""

from __future__ import annotations

import re
import shutil
import statistics
import tempfile
import time
from html import unescape
from pathlib import Path
from typing import Any

import duckdb

from pipeline.aggregate import BootstrapSettings, run_sql, set_variables
from pipeline.perf.metrics import write_synthetic_rollouts


def write_synthetic_run(run: Path, n_rollouts: int, n_tasks: int, parts: int = 4) -> None:
    """Rollouts (pipeline.perf.metrics, committed as a complete run) and, part for part, their steps
    (sql/synthetic_steps.sql) in place of the empty steps parts the commit wrote."""
    write_synthetic_rollouts(run, n_rollouts, n_tasks, parts=parts, n_models=4)
    (run / "steps").mkdir(exist_ok=True)
    con = duckdb.connect()
    for part in sorted((run / "rollouts").glob("part-*.parquet")):
        set_variables(con, rollouts_part=str(part), steps_part=str(run / "steps" / part.name))
        run_sql(con, "synthetic_steps")
    con.close()


def bench_view(n_rollouts: int = 1_000_000, workdir: str | Path | None = None, repeats: int = 5) -> dict[str, Any]:
    """Median latency of each page over `repeats` requests; returns and prints the numbers."""
    from starlette.testclient import TestClient

    from pipeline.view import RunView, create_app

    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="pexec-bench-view-"))
    run = base / "run"
    if run.exists():
        shutil.rmtree(run)
    start = time.perf_counter()
    write_synthetic_run(run, n_rollouts, max(1, n_rollouts // 10))
    result: dict[str, Any] = {"n_rollouts": n_rollouts, "generate_s": round(time.perf_counter() - start, 1)}
    start = time.perf_counter()
    view = RunView(str(run), None, BootstrapSettings(B=200))
    result["open_s"] = round(time.perf_counter() - start, 2)
    client = TestClient(create_app(view))
    start = time.perf_counter()
    client.get("/")  # the first visit computes the metrics (no metrics.parquet here)
    result["cohorts_first_s"] = round(time.perf_counter() - start, 2)
    first = client.get("/rollouts").text
    deep_id = f"r{n_rollouts // 2}"
    pages = {
        "cohorts (cached)": "/",
        "rollouts, first page": "/rollouts",
        "rollouts, cohort + cause": "/rollouts?label.model=model-1&cause=precondition",
        "rollouts, fed=3 + success=false": "/rollouts?fed=3&success=false",
        "rollouts, failing tool": "/rollouts?tool=tool_3",
        "rollouts, page after the median id": f"/rollouts?after_run=bench&after_id={deep_id}&after_shard=0002",
        "one rollout (steps)": unescape(re.findall(r'class="rollout" href="([^"]*)"', first)[0]),
    }
    for name, url in pages.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - t0)
            assert response.status_code == 200, (url, response.text[:300])
        result[name] = round(statistics.median(times) * 1000)
        print(f"{name:36s} {result[name]:6d} ms (median of {repeats})", flush=True)
    view.close()
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    print(result, flush=True)
    return result
