"""τ replay benchmark: steps/s per core and peak memory of one worker, over real tau2 results files.

    pexec bench tau, or python -m pipeline.perf.tau [--source DIR] [--repeat N] [--policy code|strict]

Replays every rollout of the source `--repeat` times in this process (one core) against the official
tools with the copy-on-write journal, and times a DB deep copy per run for comparison.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import time

from pipeline.checker import replay
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.records import parse_rollout


def bench_tau(source: str = "../shared/data/real/tau2", repeats: int = 5, policy: str = "code") -> Bench:
    """Every rollout of `source` replayed `repeats` times in this process (one core); per run, the time per
    rollout against one deep copy of the airline DB (what forking the state per rollout would cost)."""
    load = os.getloadavg()[0]
    rollouts = [parse_rollout(r) for r in ingest("tau2", [source], IngestOptions())]
    began = time.perf_counter()
    envs = {b: get_environment(b, EnvOptions(policy=policy)) for b in {r.benchmark for r in rollouts}}
    build = time.perf_counter() - began
    db = envs["tau_airline"]._state.toolkit.db if "tau_airline" in envs else None
    steps_per_s, ms_per_rollout, copy_ms = [], [], []
    for _ in range(repeats):
        steps = 0
        began = time.perf_counter()
        for rollout in rollouts:
            steps += replay(envs[rollout.benchmark], rollout).T
        seconds = time.perf_counter() - began
        steps_per_s.append(steps / seconds)
        ms_per_rollout.append(seconds / len(rollouts) * 1000)
        if db is not None:
            t = time.perf_counter()
            copy.deepcopy(db)
            copy_ms.append((time.perf_counter() - t) * 1000)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_rollout = f"replay, per rollout ({len(rollouts)} rollouts, {steps:,} steps)"
    figures = [
        figure(f"replay, one core ({len(rollouts)} rollouts)", "steps/s", steps_per_s, "none: one implementation"),
        figure(per_rollout, "ms", ms_per_rollout, "one deep copy of the airline DB", copy_ms)
        if copy_ms
        else figure(per_rollout, "ms", ms_per_rollout, "none: no airline rollouts"),
        figure("environments built (the DB parsed once per worker)", "s", [build], "none: one implementation"),
        figure("peak RSS of this worker", "MiB", [peak], "none: peak memory"),
    ]
    caption = f"{source}, policy {policy}, one core, {n_runs(repeats)}; {load_average(load)}"
    return Bench("tau", caption, figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="../shared/data/real/tau2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", default="code", choices=["code", "strict"])
    opts = parser.parse_args()
    show(bench_tau(opts.source, opts.repeat, opts.policy))


if __name__ == "__main__":
    main()
