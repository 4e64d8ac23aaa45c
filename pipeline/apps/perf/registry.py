"""The benches `pexec bench NAME` runs, each declared once: the function that measures it, the argument that
`--rollouts` sets and its default, and whether it takes `--workdir`. The bench modules are imported only when
their bench runs (some start Ray or an S3 server)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.apps.perf._processes import BENCH_ENVIRONMENT, metered
from pipeline.apps.perf.figures import Bench


@dataclass(frozen=True)
class Entry:
    function: str  # "module:function"
    size: str | None = None  # the function's argument that --rollouts sets (None: the bench has a fixed size)
    default: int = 0  # --rollouts when it is not given
    per_unit: int = 1  # rollouts per unit of `size` (merged counts tasks of 10 rollouts each)
    note: str = ""  # what the default is for, in --rollouts' help
    workdir: bool = False  # whether --workdir (where the generated data goes) is passed on

    def run(self, rollouts: int | None, workdir: Path | None, repeats: int | None) -> Bench:
        """Measure: `rollouts` (None: the default) sets the size, `repeats` (None: the bench's own) the runs. Every
        process the bench starts runs with BENCH_ENVIRONMENT (Ray's workers at the niceness of the rest), and the
        whole run's wall time, CPU-seconds, load average and niceness are measured into the bench's `usage`."""
        module, _, name = self.function.partition(":")
        kwargs: dict[str, object] = {}
        if self.size is not None:
            kwargs[self.size] = (rollouts or self.default) // self.per_unit
        if self.workdir:
            kwargs["workdir"] = workdir
        if repeats:
            kwargs["repeats"] = repeats
        measure: Callable[..., Bench] = getattr(importlib.import_module(module), name)  # a bench_* function
        before = {key: os.environ.get(key) for key in BENCH_ENVIRONMENT}
        os.environ.update(BENCH_ENVIRONMENT)  # read by a Ray when it starts: one running already keeps its own
        try:
            with metered() as meter:
                bench = measure(**kwargs)
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return bench if meter.usage is None or not isinstance(bench, Bench) else replace(bench, usage=meter.usage)


BENCHES: dict[str, Entry] = {
    "replay": Entry("pipeline.apps.perf.replay:bench_replay", "n_rollouts", 220_000, workdir=True),
    "metrics": Entry("pipeline.apps.perf.metrics:bench_metrics", "n_rollouts", 1_000_000, workdir=True),
    "merged": Entry("pipeline.apps.perf.merged:bench_merged", "n_tasks", 100_000_000, 10, "10 rollouts per task"),
    "scale": Entry("pipeline.apps.perf.scale:bench_scale", "n_rollouts", 1_000_000),
    "view": Entry("pipeline.apps.perf.view:bench_view", "n_rollouts", 1_000_000, workdir=True),
    "guard": Entry("pipeline.apps.perf.guard:bench_guard"),
    "driver": Entry("pipeline.apps.perf.driver:bench_driver", "rollouts", 4000, note="for its per-core rate"),
    "distributed": Entry(
        "pipeline.apps.perf.distributed:bench_distributed",
        "rollouts",
        10_000_000,
        workdir=True,
        note="and as many ids; a tenth of each too",
    ),
    "bfcl": Entry("pipeline.apps.perf.bfcl:bench_bfcl"),
    "tau": Entry("pipeline.apps.perf.tau:bench_tau"),
    "nightly": Entry(
        "pipeline.apps.perf.nightly:bench_nightly",
        "rollouts",
        1_000_000,
        workdir=True,
        note="as OpenAI logs; a .eval of 300 MB per million",
    ),
    "nightly_otel": Entry(
        "pipeline.apps.perf.nightly:bench_nightly_otel",
        "rollouts",
        1_000_000,
        workdir=True,
        note="as OTel protobuf spans",
    ),
    "start": Entry(
        "pipeline.apps.perf.start:bench_start",
        "rollouts",
        64_000,
        note="the largest store; three more, each a quarter of the one above",
        workdir=True,
    ),
    "split": Entry(
        "pipeline.apps.perf.split:bench_split",
        "rollouts",
        1_000_000,
        workdir=True,
        note="as one gzip OpenAI JSON Lines file",
    ),
    "raw": Entry(
        "pipeline.apps.perf.raw:bench_raw",
        "rollouts",
        100_000,
        workdir=True,
        note="as the nightly's OpenAI logs, scored inline",
    ),
    "spans": Entry(
        "pipeline.apps.perf.spans:bench_spans", "n_spans", 1_000_000, note="spans, not rollouts", workdir=True
    ),
    "parts": Entry(
        "pipeline.apps.perf.parts:bench_parts", "n_spans", 1_000_000, note="spans, not rollouts", workdir=True
    ),
}
