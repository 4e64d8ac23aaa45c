"""A scored run opened once: `open_run(url)` lists it, decides what may be read, and every table, view, metric
and query taken from the `Run` it returns reads exactly those files.

This is the one handle every reader uses (metrics, report, viewer, diff, sql, jobs, notebooks). An incomplete
run is refused unless `partial=True`; then only its committed shards are read and `Run.partial` states what they
cover (every output of such a read says so).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np

from pipeline.core.arrow import pa
from pipeline.core.text import public_url
from pipeline.metrics._population import open_population
from pipeline.metrics.cohorts import Replicates, metrics_and_replicates, metrics_tables, write_metrics
from pipeline.metrics.completeness import CoverageJSON, Snapshot, take_snapshot
from pipeline.metrics.duck import connect, run_sql, set_variables
from pipeline.metrics.query import sql
from pipeline.metrics.query_limits import QueryLimits
from pipeline.metrics.results import Cohort, ToolProfile
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, DEFAULT_POPULATION, BootstrapSettings, Population
from pipeline.metrics.tool_profiles import profiles_and_replicates


@dataclass(frozen=True)
class Run:
    """A run (or a folder of runs, such as nightly `date=…/` partitions) as it was when it was opened."""

    url: str  # as given by the caller (shown in outputs, without the credentials a URL can carry)
    storage_options: dict[str, Any] | None = field(repr=False)  # may hold credentials: never shown
    snapshot: Snapshot = field(repr=False)  # the files read: taken once, never refreshed

    def __repr__(self) -> str:
        return f"Run({public_url(self.url)!r}, {self.completeness()})"

    def completeness(self) -> str:
        """What was read, in words: `complete: 7 shards, 4,000 rollouts` or what a partial read covers."""
        return self.snapshot.describe()

    @property
    def partial(self) -> CoverageJSON | None:
        """None for a complete run; else what a partial read covers (shards, rollouts, incomplete runs), as the
        `partial` object of every JSON output (`snapshot.partial()` gives it as a Coverage)."""
        covered = self.snapshot.partial()
        return None if covered is None else covered.as_json()

    def rollouts(self) -> pa.Table:
        """One row per scored rollout (the run's `rollouts` table, every row as scored)."""
        return self._table("rollouts")

    def steps(self) -> pa.Table:
        """One row per replayed call."""
        return self._table("steps")

    def rejects(self) -> pa.Table:
        """One row per record that could not be scored, with its reason and source location."""
        return self._table("rejects")

    def rejected(self) -> int:
        """How many records were rejected at scoring (rows of `rejects`), counted from the shards' markers."""
        return self.snapshot.rejected()

    def written_by(self, population: Population = DEFAULT_POPULATION) -> list[str]:
        """Warnings where the code that wrote the logs is not the code that replayed them
        (pipeline.metrics.written_by)."""
        from pipeline.metrics.written_by import written_by_notes

        with self.connect(population) as con:
            return written_by_notes(self.snapshot, con)

    @contextmanager
    def connect(self, population: Population = DEFAULT_POPULATION) -> Iterator[duckdb.DuckDBPyConnection]:
        """A DuckDB connection whose view `rollouts` holds the rollouts `population` counts
        (pipeline.metrics._population)."""
        with open_population(self.snapshot, population) as con:
            yield con

    def cohorts(
        self,
        by: Sequence[str] | None = None,
        settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
        max_k: int | None = None,
        population: Population = DEFAULT_POPULATION,
        address: str | None = None,
    ) -> list[Cohort]:
        """Metrics per cohort with intervals, one JSON-ready dict per cohort with its PEC curve, as
        `pexec metrics --json` prints them (pipeline.metrics.cohorts.compute_metrics). `address`: computed in Ray
        tasks on the Ray there ("local": one started here), no process reading every rollout; needs the
        poisson-merged bootstrap, and gives exactly its single-node numbers (pipeline.metrics.partials)."""
        return self.cohorts_and_replicates(by, settings, max_k, population, (), address)[0]

    def cohorts_and_replicates(
        self,
        by: Sequence[str] | None = None,
        settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
        max_k: int | None = None,
        population: Population = DEFAULT_POPULATION,
        replicated: Sequence[str] = (),
        address: str | None = None,
    ) -> tuple[list[Cohort], Replicates]:
        """`cohorts`, and the bootstrap replicates' values of the `replicated` ratio metrics
        (pipeline.metrics.cohorts.metrics_and_replicates): here, or in Ray tasks on the Ray at `address`."""
        if address is not None:
            from pipeline.metrics.partials import metrics_on_ray

            return metrics_on_ray(self.snapshot, address, by, settings, max_k, population, replicated)
        return metrics_and_replicates(self.snapshot, by, settings, max_k, population, replicated)

    def metrics(
        self,
        by: Sequence[str] | None = None,
        bootstrap: int | BootstrapSettings = DEFAULT_BOOTSTRAP,
        seed: int | None = None,
        max_k: int | None = None,
        population: Population = DEFAULT_POPULATION,
    ) -> pa.Table:
        """Metrics per cohort as one table: a row per cohort, its label columns, counts, and per metric the value,
        `<metric>_lo`, `<metric>_hi` and `<metric>_method` (the layout of RUN/metrics/*/metrics.parquet).

        `bootstrap` is the number of replicates B or the full BootstrapSettings; `seed` overrides its seed.
        """
        return metrics_tables(self.cohorts(by, _settings(bootstrap, seed), max_k, population))[0]

    def pec(
        self,
        by: Sequence[str] | None = None,
        bootstrap: int | BootstrapSettings = DEFAULT_BOOTSTRAP,
        seed: int | None = None,
        max_k: int | None = None,
        population: Population = DEFAULT_POPULATION,
    ) -> pa.Table:
        """PEC(k) per cohort and depth k with its interval (the layout of RUN/metrics/*/pec.parquet)."""
        return metrics_tables(self.cohorts(by, _settings(bootstrap, seed), max_k, population))[1]

    def write_metrics(self, cohorts: list[Cohort], by: Sequence[str] | None = None) -> str:
        """Keep `cohorts` (computed with `by`) under RUN/metrics/ for `sql`; returns the folder written."""
        return write_metrics(self.snapshot.root, cohorts, by)

    def tool_profiles(
        self,
        by: Sequence[str] | None = (),
        settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
        population: Population = DEFAULT_POPULATION,
        address: str | None = None,
    ) -> list[ToolProfile]:
        """Per-tool error profiles (pipeline.metrics.tool_profiles). `address`: computed in Ray tasks on the Ray there,
        no process reading every call; needs the poisson-merged bootstrap, and gives exactly its single-node
        profiles (pipeline.metrics.tool_partials)."""
        return self.profiles_and_replicates(by, settings, population, False, address)[0]

    def profiles_and_replicates(
        self,
        by: Sequence[str] | None = (),
        settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
        population: Population = DEFAULT_POPULATION,
        replicates: bool = True,
        address: str | None = None,
    ) -> tuple[list[ToolProfile], list[np.ndarray]]:
        """`tool_profiles`, and each profile's invalid rate in every replicate
        (pipeline.metrics.tool_profiles.profiles_and_replicates): here, or in Ray tasks on the Ray at `address`."""
        if address is not None:
            from pipeline.metrics.tool_partials import profiles_on_ray

            return profiles_on_ray(self.snapshot, address, by, settings, population, replicates)
        return profiles_and_replicates(self.snapshot, by, settings, population, replicates)

    def sql(self, query: str, limits: QueryLimits | None = None) -> pa.Table:
        """A read-only query over the views steps, rollouts, rejects and the kept metrics (pipeline.metrics.query)."""
        return sql(self.snapshot, query, limits)

    def _table(self, name: str) -> pa.Table:
        files = self.snapshot.parts(name)
        if not files:
            return pa.table({})
        con = connect(self.snapshot.root)
        try:
            set_variables(con, **{f"{name}_files": files})
            run_sql(con, f"metrics/view_{name}")
            return con.sql(f"SELECT * FROM {name}").to_arrow_table()
        finally:
            con.close()


def _settings(bootstrap: int | BootstrapSettings, seed: int | None) -> BootstrapSettings:
    settings = bootstrap if isinstance(bootstrap, BootstrapSettings) else BootstrapSettings(B=bootstrap)
    return settings if seed is None else replace(settings, seed=seed)


def open_run(url: str, storage_options: dict[str, Any] | None = None, partial: bool = False) -> Run:
    """Open the run (or runs) under `url`, a local folder or an fsspec URL. Raises RunNotFound when there is none,
    RunIncomplete when one is incomplete and `partial` is not asked for."""
    return Run(url, storage_options, take_snapshot(url, storage_options, partial))
