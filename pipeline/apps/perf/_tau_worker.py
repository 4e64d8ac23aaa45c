"""One τ replay measurement in a fresh process, over whichever `pipeline` package comes first on the path:
the project's own, or an older revision's extracted by `pexec bench tau` to measure both in the same run.

    PYTHONPATH=TREE python pipeline/apps/perf/_tau_worker.py '{"source": DIR, "policy": "code", "passes": 3}'

Prints one JSON object. Uses only what every revision since the τ environment has (`replay`,
`get_environment`, `ingest`, `parse_rollout`, `TauEnvironment._call`), so that an older tree is measured as
it was, by the same loop.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, TypedDict, cast


def _peak_mib() -> float:
    """This process's peak RSS, VmHWM (read here: an older revision's tree may have no shared helper for it)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


class TauMeasurement(TypedDict):
    """The worker's one JSON object."""

    rollouts: int
    steps: int
    passes: int
    seconds: float  # the timed passes
    cpu_seconds: float
    timed_pass_seconds: float  # the pass with the tool calls timed
    tool_seconds: float  # in the official tools during that pass
    build_seconds: float  # building the environments
    db_copy_seconds: float | None  # one deep copy of the airline DB (None: no airline rollout)
    peak_rss_mib: float


def measure(source: str, policy: str, passes: int) -> TauMeasurement:
    """Every rollout of `source` replayed once to warm up, then `passes` times timed, then once more with the
    tool calls timed (`TauEnvironment._call`: the official tools on the journaled DB, copy-on-write included)."""
    from pipeline.envs import EnvOptions, get_environment
    from pipeline.envs.tau.env import TauEnvironment
    from pipeline.ingest import IngestOptions, ingest

    try:
        from pipeline.core.records import parse_rollout
        from pipeline.replay.checker import replay
    except ImportError:  # the baseline revision, from before the stages were packages
        # Modules of that revision, absent from this tree: the checker does not know them.
        from pipeline.checker import replay  # type: ignore[no-redef, import-not-found]
        from pipeline.records import parse_rollout  # type: ignore[no-redef, import-not-found]

    rollouts = [parse_rollout(r) for r in ingest("tau2", [source], IngestOptions())]
    began = time.perf_counter()
    envs = {b: get_environment(b, EnvOptions(policy=policy)) for b in {r.benchmark for r in rollouts}}
    build = time.perf_counter() - began
    steps = sum(replay(envs[r.benchmark], r).T for r in rollouts)
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(passes):
        for rollout in rollouts:
            replay(envs[rollout.benchmark], rollout)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu

    in_tools = 0.0
    call = TauEnvironment._call

    def timed(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_tools
        t = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            in_tools += time.perf_counter() - t

    # Deliberately patched for one pass: the time spent in the official tools, measured the same way in any revision.
    TauEnvironment._call = timed  # type: ignore[method-assign]
    began = time.perf_counter()
    for rollout in rollouts:
        replay(envs[rollout.benchmark], rollout)
    timed_pass = time.perf_counter() - began
    TauEnvironment._call = call  # type: ignore[method-assign]  # restored

    copy_s = None
    if "tau_airline" in envs:
        airline = cast(TauEnvironment, envs["tau_airline"])  # what the registry makes of tau_airline
        began = time.perf_counter()
        copy.deepcopy(airline._state.toolkit.db)
        copy_s = time.perf_counter() - began
    return {
        "rollouts": len(rollouts),
        "steps": steps,
        "passes": passes,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "timed_pass_seconds": timed_pass,
        "tool_seconds": in_tools,
        "build_seconds": build,
        "db_copy_seconds": copy_s,
        "peak_rss_mib": _peak_mib(),
    }


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != here]  # run as a script: no package root
    options = json.loads(sys.argv[1])
    print(json.dumps(measure(options["source"], options["policy"], options["passes"])))


if __name__ == "__main__":
    main()
