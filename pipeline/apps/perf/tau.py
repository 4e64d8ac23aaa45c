"""τ replay benchmark: steps/s per core, time per rollout beyond the tool calls and peak memory of one worker,
over real tau2 results files, against the code of an earlier revision measured in the same run.

    pexec bench tau, or python -m pipeline.apps.perf.tau [--source DIR] [--repeat N] [--policy code|strict]
                                                    [--passes N] [--baseline REV|none]

Every repetition runs the project and the baseline revision (default c0f23f9, the code before the work
on faster replay; extracted with `git archive` from this checkout's history) in fresh processes, one after
the other, alternating which goes first: each replays every rollout of the source once to warm up, then
`--passes` times timed, on one core, against the official tools with the copy-on-write journal
(pipeline/apps/perf/_tau_worker.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from pipeline.apps.perf._tau_worker import TauMeasurement
from pipeline.apps.perf.figures import Bench, Figure, figure, load_average, n_runs, show
from pipeline.core.errors import PexecError

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).resolve().with_name("_tau_worker.py")
BASELINE = "c0f23f9"  # the code before the replay-speed work


def bench_tau(
    source: str = "../shared/data/real/tau2",
    repeats: int = 5,
    policy: str = "code",
    passes: int = 3,
    baseline: str | None = BASELINE,
) -> Bench:
    """The project against revision `baseline` (None: no baseline), `repeats` times interleaved."""
    load = os.getloadavg()[0]
    options = json.dumps({"source": str(Path(source).resolve()), "policy": policy, "passes": passes})
    with tempfile.TemporaryDirectory(prefix="pexec-bench-tau-") as tmp:
        tree, missing = _checkout(baseline, Path(tmp)) if baseline else (None, "none: no baseline asked for")
        project: list[TauMeasurement] = []
        base: list[TauMeasurement] = []
        for i in range(repeats):
            order = [(ROOT, project), (tree, base)] if tree is not None else [(ROOT, project)]
            for where, runs in order[:: 1 if i % 2 else -1]:
                runs.append(_run(where, options))
    about = f"revision {baseline}" if tree is not None else missing

    def pair(name: str, unit: str, value: Callable[[TauMeasurement], float]) -> Figure:
        return figure(name, unit, [value(r) for r in project], about, [value(r) for r in base] if base else None)

    first = project[0]
    size = f"{first['rollouts']} rollouts, {first['steps']:,} steps"
    figures = [
        pair(f"replay, one core ({size})", "steps/s", lambda r: r["steps"] * r["passes"] / r["seconds"]),
        pair("replay, per rollout", "ms", lambda r: r["seconds"] / (r["passes"] * r["rollouts"]) * 1000),
        pair(
            "per rollout beyond the tool calls (the official tools on the journaled DB)",
            "ms",
            lambda r: (r["timed_pass_seconds"] - r["tool_seconds"]) / r["rollouts"] * 1000,
        ),
        pair("environments built (the DB parsed once per worker)", "s", lambda r: r["build_seconds"]),
        pair("peak RSS of a worker", "MiB", lambda r: r["peak_rss_mib"]),
    ]
    if first["db_copy_seconds"] is not None:
        copies = [c * 1000 for c in (r["db_copy_seconds"] for r in project) if c is not None]
        instead = "none: what forking the DB per rollout would cost instead of the journal"
        figures.append(figure("one deep copy of the airline DB", "ms", copies, instead))
    caption = (
        f"{source}, policy {policy}, one core, {n_runs(repeats)} in fresh processes, each a warm-up and "
        f"{passes} timed passes; {load_average(load)}"
    )
    return Bench("tau", caption, figures, {"project": project, "baseline": base, "baseline_revision": baseline})


def _checkout(revision: str, into: Path) -> tuple[Path | None, str]:
    """The source tree of `revision` from this checkout's git history, or None and why it is not there."""
    archive = into / "baseline.tar"
    commands = [
        ["git", "-C", str(ROOT), "archive", f"--output={archive}", revision],
        ["tar", "-xf", str(archive), "-C", str(into)],
    ]
    try:
        for command in commands:
            subprocess.run(command, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        reason = (getattr(exc, "stderr", b"") or str(exc).encode()).decode().strip()[:120]
        return None, f"none: {revision} could not be taken from this checkout's git history ({reason})"
    return into, ""


def _run(tree: Path, options: str) -> TauMeasurement:
    """One worker process over the `pipeline` package of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(WORKER), options], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise PexecError(f"τ bench worker over {tree} failed: {done.stderr.strip()[-2000:]}")
    measured: TauMeasurement = json.loads(done.stdout.splitlines()[-1])  # the worker's last line
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="../shared/data/real/tau2")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--policy", default="code", choices=["code", "strict"])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="a git revision, or none")
    opts = parser.parse_args()
    baseline = None if opts.baseline == "none" else opts.baseline
    show(bench_tau(opts.source, opts.repeat, opts.policy, opts.passes, baseline))


if __name__ == "__main__":
    main()
