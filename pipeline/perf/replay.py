"""Replay throughput: the full pipeline through local Ray on a synthetic `shop` store, beside a naive
per-step baseline measured in the same run (jsonschema.validate per call, the state deep-copied per step).

Run: `pexec bench replay [--rollouts N]` or `python -m pipeline.perf.replay`.
"""

from __future__ import annotations

import copy
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from pipeline.checker import replay
from pipeline.dependencies import grounded_values
from pipeline.distributed import run_scoring
from pipeline.envs import get_environment
from pipeline.envs.document import JournaledDoc
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.perf import dev_dependency
from pipeline.records import parse_rollout
from pipeline.storage.stores import write_store
from pipeline.synth import synthesize

NAIVE = "the naive baseline of `pexec bench replay`"


def naive_replay(env: SpecEnvironment, record: dict[str, Any]) -> list[bool]:
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
        outcome = env.execute(state, event["tool"], args, None)  # type: ignore[arg-type]
        if outcome.accepted:
            seen += orjson.dumps(outcome.output).decode()
        flags.append(outcome.accepted)
        snapshots.append(copy.deepcopy(state.doc))
    return flags


def bench_replay(
    n_rollouts: int = 220_000,
    n_tasks: int = 20_000,
    workdir: Path | None = None,
    baseline_sample: int = 2_000,
    cpus: tuple[int, ...] = (1, 2),
) -> dict[str, Any]:
    dev_dependency("jsonschema", NAIVE)  # before the store is written, not after
    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-"))
    store = root / "store"
    if store.exists():
        shutil.rmtree(store)
    t0 = time.perf_counter()
    write_store(synthesize("shop", n_rollouts, n_tasks, seed=0), str(store), per_file=10_000)
    print(f"synth: {n_rollouts:,} rollouts in {time.perf_counter() - t0:.1f}s -> {store}")

    # Baseline and the optimised checker on the same sample, one core, in this process.
    records = [
        r for _, r in zip(range(baseline_sample), synthesize("shop", baseline_sample, n_tasks, seed=0), strict=False)
    ]
    env = get_environment("shop")
    steps = sum(e["type"] == "call" for r in records for e in r["events"])
    t0 = time.perf_counter()
    for r in records:
        naive_replay(env, r)  # type: ignore[arg-type]
    naive = steps / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for r in records:
        replay(env, parse_rollout(r))
    checker = steps / (time.perf_counter() - t0)
    print(
        f"one core, {baseline_sample:,} rollouts: naive {naive:,.0f} steps/s · checker {checker:,.0f} steps/s "
        f"({checker / naive:.1f}x)"
    )

    results: dict[str, Any] = {"naive_steps_per_s": naive, "checker_steps_per_s": checker, "ray": {}}
    import ray

    for n in cpus:
        run = root / f"run-{n}cpu"
        shutil.rmtree(run, ignore_errors=True)
        t0 = time.perf_counter()
        manifest = run_scoring(str(store), str(run), num_cpus=n, shard_bytes=8 * 2**20)
        seconds = time.perf_counter() - t0
        ray.shutdown()
        c = manifest["counts"]
        worker_peak = max(s["peak_rss_mib"] for s in manifest["shards"])
        row = {
            "seconds": seconds,
            "rollouts_per_s_per_core": c["scored"] / seconds / n,
            "steps_per_s_per_core": c["steps"] / seconds / n,
            "worker_peak_rss_mib": worker_peak,
            "rollouts": c["scored"],
            "steps": c["steps"],
        }
        results["ray"][n] = row
        print(
            f"ray {n} cpu: {c['scored']:,} rollouts, {c['steps']:,} steps in {seconds:.1f}s (incl. Ray start) · "
            f"{row['rollouts_per_s_per_core']:,.0f} rollouts/s/core · {row['steps_per_s_per_core']:,.0f} steps/s/core"
            f" · {row['steps_per_s_per_core'] / naive:.1f}x naive · worker peak {worker_peak:,.0f} MiB"
        )
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["driver_peak_rss_mib"] = driver
    print(f"driver peak RSS {driver:,.0f} MiB")
    return results


if __name__ == "__main__":
    bench_replay()
