"""BFCL replay throughput: the full checker (S/D/P, causes, fidelity) over the official simulators, beside
BFCL's own execution path (`multi_turn_utils.execute_multi_turn_func_call`, eval on module-global instances)
on the same calls in the same run, one core each.

Calls: the ground truth of the 800 v4 multi-turn tasks, plus a real run's result files when given.
Run: `python -m pipeline.benchmarks.bfcl [--real DIR] [--repeat N]`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from pipeline.checker import replay
from pipeline.envs import get_environment
from pipeline.envs.bfcl import official
from pipeline.ingest import IngestOptions, ingest
from pipeline.ingest.bfcl import build_record
from pipeline.model import Call, Rollout
from pipeline.records import parse_rollout


def ground_truth_rollouts() -> list[Rollout]:
    rollouts = []
    for category in official.CATEGORIES:
        tasks = official.read_data_file(official.data_file_name("v4", category))
        answers = {
            a["id"]: a["ground_truth"] for a in official.read_data_file(official.data_file_name("v4", category, True))
        }
        for task in tasks:
            entry = {"id": task["id"], "result": [[[c] for c in turn] for turn in answers[task["id"]]]}
            rollouts.append(parse_rollout(build_record(task, entry, "bfcl_v4", category, {"model": "gt"}, True)))
    return rollouts


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


def checker_path(rollouts: list[Rollout]) -> int:
    env = get_environment("bfcl_v4")
    return sum(replay(env, rollout).T for rollout in rollouts)


def measure(rollouts: list[Rollout], repeat: int) -> dict[str, Any]:
    checker_path(rollouts[:50])  # build the environment and import the simulators outside the timing
    best: dict[str, float] = {}
    steps = sum(len(r.calls) for r in rollouts)
    for i in range(repeat):
        began = time.perf_counter()
        checker_path(rollouts)
        best["checker"] = min(best.get("checker", float("inf")), time.perf_counter() - began)
        began = time.perf_counter()
        official_path(rollouts, str(i))
        best["official"] = min(best.get("official", float("inf")), time.perf_counter() - began)
    return {
        "rollouts": len(rollouts),
        "steps": steps,
        "checker_steps_per_s": steps / best["checker"],
        "official_steps_per_s": steps / best["official"],
        "checker_us_per_call": 1e6 * best["checker"] / steps,
        "official_us_per_call": 1e6 * best["official"] / steps,
        "speedup": best["official"] / best["checker"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", help="a folder of BFCL result files (e.g. ../shared/data/real/bfcl/gpt-oss-120b)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = parser.parse_args()
    sets = {"ground truth (800 v4 tasks)": ground_truth_rollouts()}
    if args.real:
        sets["real run"] = [parse_rollout(r) for r in ingest("bfcl", [args.real], IngestOptions())]
    print(f"{official.release('v4').pin}, one core, best of {args.repeat}")
    print("| calls | rollouts | steps | pexec checker steps/s | µs/call | BFCL official steps/s | µs/call | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rollouts in sets.items():
        m = measure(rollouts, args.repeat)
        print(
            f"| {name} | {m['rollouts']} | {m['steps']} "
            f"| {m['checker_steps_per_s']:,.0f} | {m['checker_us_per_call']:.0f} "
            f"| {m['official_steps_per_s']:,.0f} | {m['official_us_per_call']:.0f} | {m['speedup']:.1f}× |"
        )


if __name__ == "__main__":
    main()
