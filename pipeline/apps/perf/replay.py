"""Replay throughput: the full pipeline through local Ray on a synthetic `shop` store, beside a naive
per-step baseline measured in the same run (jsonschema.validate per call, the state deep-copied per step).

Run: `pexec bench replay [--rollouts N]` or `python -m pipeline.apps.perf.replay`.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

import orjson

from pipeline.apps.perf import cluster_projection, dev_dependency
from pipeline.apps.perf._processes import local_ray
from pipeline.apps.perf.figures import Bench, Figure, figure, load_average, n_runs, show
from pipeline.core.model import Call
from pipeline.core.records import parse_rollout
from pipeline.envs import get_environment
from pipeline.envs.document import JournaledDoc
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.replay.checker import replay
from pipeline.replay.dependencies import grounded_values
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.memory import peak_mib
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

NAIVE = "the naive baseline of `pexec bench replay`"


def naive_replay(env: SpecEnvironment, record: Mapping[str, Any]) -> list[bool]:
    """The straightforward loop: validate with jsonschema, snapshot the whole state before every step."""
    jsonschema = dev_dependency("jsonschema", NAIVE)
    state = JournaledDoc(copy.deepcopy(env.spec.initial_state))
    snapshots = [copy.deepcopy(state.doc)]
    seen = ""
    flags = []
    for event in record["events"]:
        if event["type"] == "message":
            seen += event["content"]
            continue
        rules = env.spec.tools.get(event["tool"])
        args = event["arguments"]
        try:
            args = orjson.loads(args) if isinstance(args, str) else args
            if rules is None:
                raise ValueError("unknown tool")
            jsonschema.validate(args, rules.info.parameters)
            for path in rules.info.grounded:
                if any(str(v) not in seen for v in grounded_values(args, path)):
                    raise ValueError("ungrounded")
        except (ValueError, jsonschema.ValidationError):
            flags.append(False)
            continue
        outcome = env.execute(state, event["tool"], args, Call(event["tool"], args))
        if outcome.accepted:
            seen += orjson.dumps(outcome.output).decode()
        flags.append(outcome.accepted)
        snapshots.append(copy.deepcopy(state.doc))
    return flags


class RayRun(TypedDict):
    """One end-to-end scoring through local Ray."""

    seconds: float
    steps_per_s_per_core: float
    steps_per_rollout: float
    worker_peak_rss_mib: float  # the largest scoring task's own peak (its shard report's VmHWM)


@dataclass(frozen=True)
class ReplayRun:
    """One repetition: the naive loop's and the checker's steps/s on the sample, and the Ray runs by CPUs."""

    naive: float
    checker: float
    ray: dict[int, RayRun]

    def as_details(self) -> dict[str | int, float | RayRun]:
        """As `details["runs"]` has it: the two rates, then one entry per number of CPUs."""
        out: dict[str | int, float | RayRun] = {"naive": self.naive, "checker": self.checker}
        out.update(self.ray.items())
        return out


def bench_replay(
    n_rollouts: int = 220_000,
    n_tasks: int = 20_000,
    workdir: Path | None = None,
    baseline_sample: int = 2_000,
    cpus: tuple[int, ...] = (1, 2),
    repeats: int = 3,
) -> Bench:
    dev_dependency("jsonschema", NAIVE)  # before the store is written, not after
    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-"))
    store = root / "store"
    if store.exists():
        shutil.rmtree(store)
    load = os.getloadavg()[0]
    write_store(synthesize("shop", n_rollouts, n_tasks, seed=0), str(store), per_file=10_000)
    records = [
        r for _, r in zip(range(baseline_sample), synthesize("shop", baseline_sample, n_tasks, seed=0), strict=False)
    ]
    env = get_environment("shop")
    spec = cast(SpecEnvironment, env)  # `shop` is a spec
    sample_steps = sum(e["type"] == "call" for r in records for e in r["events"])
    runs: list[ReplayRun] = []
    for _ in range(repeats):
        # Baseline and the optimised checker on the same sample, one core, in this process.
        t0 = time.perf_counter()
        for r in records:
            naive_replay(spec, r)
        naive = sample_steps / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for r in records:
            replay(env, parse_rollout(r))
        checker = sample_steps / (time.perf_counter() - t0)
        ray: dict[int, RayRun] = {}
        for n in cpus:
            out = root / f"run-{n}cpu"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()  # Ray's start-up included, as a scoring command's
            with local_ray(n):
                manifest = run_scoring(str(store), str(out), ScoreSettings(shard_mb=8))
                seconds = time.perf_counter() - t0
            c = manifest.counts
            ray[n] = {
                "seconds": seconds,
                "steps_per_s_per_core": c.steps / seconds / n,
                "steps_per_rollout": c.steps / c.scored,
                "worker_peak_rss_mib": max(s.peak_rss_mib for s in manifest.shards),
            }
        runs.append(ReplayRun(naive, checker, ray))
    driver = peak_mib()
    return Bench("replay", _caption(n_rollouts, baseline_sample, repeats, load), _figures(runs, cpus, driver),
                 {"runs": [r.as_details() for r in runs], "driver_peak_rss_mib": driver})  # fmt: skip


def _caption(n_rollouts: int, sample: int, repeats: int, load: float) -> str:
    return (
        f"synthetic `shop` store of {n_rollouts:,} rollouts scored end to end through local Ray (8 MiB shards, Ray "
        f"start-up included); naive loop and checker on a {sample:,}-rollout sample in this process; "
        f"{n_runs(repeats)}; {load_average(load)}"
    )


def _figures(runs: list[ReplayRun], cpus: tuple[int, ...], driver_mib: float) -> list[Figure]:
    naive = "naive loop, one core"
    out = [figure("checker in-process, one core", "steps/s", [r.checker for r in runs], naive,
                  [r.naive for r in runs])]  # fmt: skip
    for n in cpus:
        per_core = [r.ray[n]["steps_per_s_per_core"] for r in runs]
        out.append(figure(f"Ray, {n} CPU, end to end, per core", "steps/s", per_core, naive, [r.naive for r in runs]))
    if len(cpus) > 1:
        lo, hi = min(cpus), max(cpus)
        out.append(figure(f"Ray, {hi} CPUs, end to end, all cores", "steps/s",
                          [r.ray[hi]["steps_per_s_per_core"] * hi for r in runs], f"{lo} CPU",
                          [r.ray[lo]["steps_per_s_per_core"] * lo for r in runs]))  # fmt: skip
    top = max(cpus)
    out += [
        figure("worker peak RSS", "MiB", [max(r.ray[n]["worker_peak_rss_mib"] for n in cpus) for r in runs],
               "none: peak memory"),
        figure("driver peak RSS (this process, store generation included)", "MiB", [driver_mib], "none: peak memory"),
        cluster_projection([r.ray[top]["steps_per_s_per_core"] for r in runs],
                           [r.ray[top]["steps_per_rollout"] for r in runs],
                           f"Ray with {top} CPUs on local disk"),
    ]  # fmt: skip
    return out


if __name__ == "__main__":
    show(bench_replay())
