"""Benchmark of `pexec view`'s pages on a large run (docs/explanation/measured-facts.md): the synthetic rollouts table
of pipeline.apps.perf.metrics plus its steps, served by the real app, each page timed end to end (query +
template). Run it as `pexec bench view [--rollouts N] [--workdir DIR]`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from html import unescape
from pathlib import Path

import duckdb

from pipeline.apps.perf._fixtures import commit_parts
from pipeline.apps.perf.figures import Bench, figure, load_average
from pipeline.apps.perf.metrics import write_synthetic_rollouts
from pipeline.metrics.duck import run_sql, set_variables
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings


def write_synthetic_run(run: Path, n_rollouts: int, n_tasks: int, parts: int = 4) -> None:
    """Rollouts (pipeline.apps.perf.metrics, committed as a complete run) and, part for part, their steps
    (perf/sql/synthetic_steps.sql) in place of the empty steps parts the commit wrote."""
    write_synthetic_rollouts(run, n_rollouts, n_tasks, parts=parts, n_models=4)
    (run / "steps").mkdir(exist_ok=True)
    con = duckdb.connect()
    for part in sorted((run / "rollouts").glob("part-*.parquet")):
        set_variables(con, rollouts_part=str(part), steps_part=str(run / "steps" / part.name))
        run_sql(con, "apps/perf/synthetic_steps")
    con.close()
    commit_parts(str(run))  # again: the markers record the steps parts written here (readers check every part)


def bench_view(n_rollouts: int = 1_000_000, workdir: str | Path | None = None, repeats: int = 5) -> Bench:
    """Latency of each page over `repeats` requests."""
    from starlette.testclient import TestClient

    from pipeline.apps.view import RunView, create_app

    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="pexec-bench-view-"))
    run = base / "run"
    if run.exists():
        shutil.rmtree(run)
    load = os.getloadavg()[0]
    write_synthetic_run(run, n_rollouts, max(1, n_rollouts // 10))
    start = time.perf_counter()
    view = RunView(open_run(str(run)), BootstrapSettings(B=200))
    opened = time.perf_counter() - start
    client = TestClient(create_app(view))
    start = time.perf_counter()
    client.get("/")  # the first visit computes the metrics (no metrics.parquet here)
    first_visit = time.perf_counter() - start
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
    times: dict[str, list[float]] = {}
    for name, url in pages.items():
        times[name] = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            response = client.get(url)
            times[name].append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, (url, response.text[:300])
    view.close()
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    none = "none: one implementation"
    figures = [
        figure("opening the run", "ms", [opened * 1000], none),
        figure("cohorts, first visit without metrics.parquet (computes the metrics, B = 200)", "ms",
               [first_visit * 1000], none),
    ]  # fmt: skip
    for name, values in times.items():
        if name == "rollouts, page after the median id":  # keyset paging: no dearer than the first page
            figures.append(figure(name, "ms", values, "the first page", times["rollouts, first page"]))
        else:
            figures.append(figure(name, "ms", values, none))
    caption = (
        f"synthetic run of {n_rollouts:,} rollouts (4 model cohorts, their steps, 4 part files), local disk, the "
        f"real app through Starlette's test client, {repeats} requests per page; "
        f"{load_average(load)}"
    )
    return Bench("view", caption, figures, {"ms": times, "open_s": opened, "cohorts_first_s": first_visit})
