"""τ replay benchmark: steps/s per core and peak memory of one worker, over real tau2 results files.

    python -m pipeline.perf.tau [--source DIR] [--repeat N] [--policy code|strict]

Replays every rollout of the source `--repeat` times in this process (one core) against the official
tools with the copy-on-write journal, and times a per-rollout DB deep copy for comparison.
"""

from __future__ import annotations

import argparse
import copy
import resource
import time

from pipeline.checker import replay
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.records import parse_rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="../shared/data/real/tau2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", default="code", choices=["code", "strict"])
    opts = parser.parse_args()
    rollouts = [parse_rollout(r) for r in ingest("tau2", [opts.source], IngestOptions())]
    began = time.perf_counter()
    envs = {b: get_environment(b, EnvOptions(policy=opts.policy)) for b in {r.benchmark for r in rollouts}}
    build = time.perf_counter() - began
    steps = 0
    began = time.perf_counter()
    for _ in range(opts.repeat):
        for rollout in rollouts:
            steps += replay(envs[rollout.benchmark], rollout).T
    seconds = time.perf_counter() - began
    db = envs["tau_airline"]._state.toolkit.db if "tau_airline" in envs else None
    copy_ms = None
    if db is not None:
        t = time.perf_counter()
        copy.deepcopy(db)
        copy_ms = (time.perf_counter() - t) * 1000
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"environments built in {build:.2f} s (DB parsed once per worker)")
    print(
        f"{len(rollouts) * opts.repeat} rollouts, {steps} steps in {seconds:.2f} s: "
        f"{steps / seconds:,.0f} steps/s, {len(rollouts) * opts.repeat / seconds:,.0f} rollouts/s on one core"
    )
    if copy_ms is not None:
        print(f"for comparison, one deep copy of the airline DB: {copy_ms:.0f} ms")
    print(f"peak RSS of this worker: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
