"""BFCL replay throughput: the full checker (S/D/P, causes, fidelity) over the official simulators, beside
BFCL's own execution path (`multi_turn_utils.execute_multi_turn_func_call`, eval on module-global instances)
on the same calls in the same run, one core each. Every timed pass of the checker starts with new
environments, so scenarios loaded by an earlier pass do not make a later one faster.

Calls: the ground truth of the 800 v4 multi-turn tasks, plus a real run's result files when given, and the
800 v3 tasks against 2025.8.6.2 (checker only: BFCL's own path runs on the installed release).
Run: `pexec bench bfcl` or `python -m pipeline.apps.perf.bfcl [--real DIR] [--repeat N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import partial
from typing import NotRequired, TypedDict

from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.core.model import Call, Rollout
from pipeline.core.records import parse_rollout
from pipeline.envs import Environment, new_environment
from pipeline.envs.bfcl import official as official
from pipeline.ingest import IngestOptions, ingest
from pipeline.ingest.bfcl import ground_truth_records
from pipeline.replay.checker import replay


def ground_truth_rollouts(tag: str) -> list[Rollout]:
    return [parse_rollout(r) for r in ground_truth_records(tag, f"bfcl_{tag}")]


def _call_text(call: Call) -> str:
    args = call.arguments if isinstance(call.arguments, dict) else json.loads(call.arguments or "{}")
    return f"{call.tool}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def official_path(rollouts: list[Rollout], tag: str) -> int:
    """Every call through BFCL's own path, one invocation per step as its inference loop does."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    n = 0
    for rollout in rollouts:
        env = rollout.env
        for call in rollout.calls:
            multi_turn_utils.execute_multi_turn_func_call(
                [_call_text(call)],
                env["initial_config"],
                env["involved_classes"],
                f"bench{tag}",
                rollout.rollout_id,
                long_context=env.get("long_context", False),
            )
            n += 1
    # BFCL keeps its instances as module globals for the whole process; drop ours again.
    for name in [k for k in vars(multi_turn_utils) if k.startswith(f"bench{tag}_")]:
        delattr(multi_turn_utils, name)
    return n


def checker_path(rollouts: list[Rollout], environments: dict[str, Environment]) -> int:
    return sum(replay(environments[rollout.benchmark], rollout).T for rollout in rollouts)


def fresh_environments(rollouts: list[Rollout]) -> dict[str, Environment]:
    """The rollouts' environments, new instances: a timed pass starts with no scenario loaded (the BFCL
    environment keeps loaded scenarios for later rollouts), as a worker's first shard of a run does."""
    return {name: new_environment(name) for name in {r.benchmark for r in rollouts}}


class Throughput(TypedDict):
    """Calls per second of each path, best of the repetitions."""

    rollouts: int
    steps: int
    checker: float
    official: NotRequired[float]  # BFCL's own path, when measured


def measure(rollouts: list[Rollout], repeat: int, official: bool = True) -> Throughput:
    """Best-of-`repeat` throughput of the checker and (when `official`) of BFCL's own path on `rollouts`."""
    checker_path(rollouts[:50], fresh_environments(rollouts))  # import the simulators outside the timing
    best: dict[str, float] = {}
    steps = sum(len(r.calls) for r in rollouts)
    for i in range(repeat):
        checker = partial(checker_path, environments=fresh_environments(rollouts))  # built outside the timing
        paths: dict[str, Callable[[list[Rollout]], int]] = {"checker": checker}
        if official:
            paths["official"] = partial(official_path, tag=str(i))
        for name, path in paths.items():
            began = time.perf_counter()
            path(rollouts)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - began)
    out: Throughput = {"rollouts": len(rollouts), "steps": steps, "checker": steps / best["checker"]}
    if "official" in best:
        out["official"] = steps / best["official"]
    return out


def bench_bfcl(real: str | None = None, repeats: int = 3) -> Bench:
    """µs per call of the checker and of BFCL's own path on each set of calls, `repeats` runs interleaved."""
    load = os.getloadavg()[0]
    # BFCL's own path runs on the installed release only: the v3 set (2025.8.6.2) has no official column.
    sets = {"ground truth, 800 v4 tasks": (ground_truth_rollouts("v4"), True)}
    if real:
        sets["real run"] = ([parse_rollout(r) for r in ingest("bfcl", [real], IngestOptions())], True)
    sets["ground truth, 800 v3 tasks (2025.8.6.2)"] = (ground_truth_rollouts("v3"), False)
    figures = []
    for name, (rollouts, with_official) in sets.items():
        runs = [measure(rollouts, 1, with_official) for _ in range(repeats)]
        who = f"{name} ({runs[0]['steps']:,} calls in {runs[0]['rollouts']:,} rollouts): checker, all checks"
        checker = [1e6 / m["checker"] for m in runs]
        if with_official:
            official_us = [1e6 / m["official"] for m in runs]
            figures.append(figure(who, "µs/call", checker, "BFCL's own execution path", official_us))
        else:
            figures.append(figure(who, "µs/call", checker, "none: BFCL's own path runs on the installed release only"))
    caption = (
        f"{official.release('v4').pin} (official path), one core, {n_runs(repeats)} interleaved; {load_average(load)}"
    )
    return Bench("bfcl", caption, figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", help="a folder of BFCL result files (e.g. ../shared/data/real/bfcl/gpt-oss-120b)")
    parser.add_argument("--repeat", type=int, default=3, help="runs")
    args = parser.parse_args()
    show(bench_bfcl(args.real, args.repeat))


if __name__ == "__main__":
    main()
