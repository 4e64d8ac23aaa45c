"""What local Ray's start costs a small run, and from what size it pays (`pexec bench start`,
`python -m pipeline.apps.perf.start`).

In one run, every step a fresh process (its wall time from the outside; its CPU-seconds read by itself before it
exits, Ray's processes included, `_processes.cpu_seconds`):
  - the fixed cost: pexec's local Ray started (`pipeline.core.ray_start.start_ray`, 2 CPUs) and two empty tasks
    run, against a process that imports the same modules and starts nothing;
  - synthetic `shop` stores of growing size scored in this process (`pexec score --inline`), against the same
    store scored on local Ray with 2 CPUs (`--num-cpus 2`), each store both ways in the same repetition.
The crossover is the size at which Ray's wall time falls below the in-process one: below it, `pexec score` with
no option scores in this process (pipeline.scoring.settings.IN_PROCESS_BELOW_MB); each row says which way that
size goes by default.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal, TypedDict

import orjson

from pipeline.apps.perf._processes import COUNTED_BY, counted_by, counting
from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.scoring.memory import peak_mib
from pipeline.scoring.settings import IN_PROCESS_BELOW_MB

SIZES = (1000, 4000, 16_000, 64_000)  # rollouts of the stores scored both ways
CPUS = 2


class Step(TypedDict):
    """One step, measured in a process of its own."""

    seconds: float  # wall, from outside the process (start-up and imports included)
    cpu_s: float  # the process and its children, Ray's included
    peak_mib: float
    scored: int
    executor: str


def _store(root: Path, rollouts: int) -> tuple[Path, int]:
    from pipeline.storage.stores import write_store
    from pipeline.synthetic.rollouts import synthesize

    store = root / f"store-{rollouts}"
    if not store.exists():
        write_store(synthesize("shop", rollouts, max(1, rollouts // 10), seed=0), str(store), per_file=rollouts)
    return store, sum(f.stat().st_size for f in store.iterdir())


def _empty() -> int:
    return os.getpid()


def _step(argv: list[str]) -> dict[str, object]:
    """In the fresh process: `start` (Ray and two empty tasks), `import` (the modules only), or `score STORE RUN
    WHERE` (WHERE: `inline` in this process, `ray` on a local Ray of CPUS CPUs)."""
    with counting() as cpu:
        scored, executor = _work(argv)
        return {"cpu_s": cpu(), "peak_mib": peak_mib(), "scored": scored, "executor": executor}


def _work(argv: list[str]) -> tuple[int, str]:
    from pipeline.core.ray_start import start_ray
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings

    scored, executor = 0, "none"
    if argv[0] == "start":
        import ray

        start_ray(None, CPUS)
        task = ray.remote(_empty)
        ray.get([task.remote() for _ in range(CPUS)])
        executor = "ray"
    elif argv[0] == "score":
        store, run, where = argv[1:]
        settings = ScoreSettings(inline=True) if where == "inline" else ScoreSettings(num_cpus=CPUS)
        manifest = run_scoring(store, run, settings)
        scored, executor = manifest.counts.scored, manifest.settings.executor
    return scored, executor


# Ray gives its raylet 30 s to start: on a machine whose load is many times its cores it may not, and the step fails
# before measuring anything. Such a step is run again (at most RETRIES times), and the caption counts them.
RAY_START_TIMED_OUT = "timed out during startup"
RETRIES = 2


def _fresh(*args: str, retried: list[str] | None = None) -> Step:
    command = [sys.executable, "-m", "pipeline.apps.perf.start", "--step", *args]
    for attempt in range(RETRIES + 1):
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": ""})
        if done.returncode == 0 or RAY_START_TIMED_OUT not in done.stderr or attempt == RETRIES:
            break
        if retried is not None:
            retried.append(" ".join(args))
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr[-4000:])
    measured = orjson.loads(done.stdout.strip().splitlines()[-1])  # _step's, from that process
    return Step(
        seconds=time.perf_counter() - began,
        cpu_s=measured["cpu_s"],
        peak_mib=measured["peak_mib"],
        scored=measured["scored"],
        executor=measured["executor"],
    )


def bench_start(
    sizes: tuple[int, ...] = SIZES, repeats: int = 3, workdir: Path | None = None, rollouts: int | None = None
) -> Bench:
    """`rollouts`: the largest store (`pexec bench start --rollouts N`), the others a quarter of the one above."""
    if rollouts is not None:
        sizes = tuple(sorted({max(100, rollouts >> (2 * i)) for i in range(len(sizes))}))
    load = os.getloadavg()[0]
    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-start-"))
    runs: dict[str, list[Step]] = {}
    mib: dict[int, float] = {}
    retried: list[str] = []
    try:
        stores = {n: _store(root, n) for n in sizes}
        mib = {n: size / 2**20 for n, (_, size) in stores.items()}
        for _ in range(repeats):
            runs.setdefault("start", []).append(_fresh("start", retried=retried))
            runs.setdefault("import", []).append(_fresh("import"))
            for n, (store, _) in stores.items():
                for where in ("inline", "ray"):
                    run = root / f"run-{n}-{where}"
                    shutil.rmtree(run, ignore_errors=True)
                    step = _fresh("score", str(store), str(run), where, retried=retried)
                    if step["scored"] != n:
                        raise AssertionError(f"{n:,} rollouts written, {step['scored']:,} scored ({where})")
                    runs.setdefault(f"{where} {n}", []).append(step)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)

    def v(key: str, field: Literal["seconds", "cpu_s"] = "seconds") -> list[float]:
        return [r[field] for r in runs[key]]

    figures = [
        figure(f"local Ray start ({CPUS} CPUs) and two empty tasks, a fresh process", "s", v("start"),
               "the same process without Ray", v("import"), cpu=v("start", "cpu_s"),
               baseline_cpu=v("import", "cpu_s")),
    ]  # fmt: skip
    for n in sizes:
        default = "in this process" if mib[n] < IN_PROCESS_BELOW_MB else "on Ray"
        figures.append(figure(
            f"score {n:,} `shop` rollouts ({mib[n]:,.1f} MiB) in this process, a fresh process (`pexec score`'s "
            f"default at this size: {default})", "s", v(f"inline {n}"), f"local Ray, {CPUS} CPUs (--num-cpus {CPUS})",
            v(f"ray {n}"), cpu=v(f"inline {n}", "cpu_s"), baseline_cpu=v(f"ray {n}", "cpu_s")))  # fmt: skip
    caption = (
        f"synthetic `shop` stores of {', '.join(f'{n:,}' for n in sizes)} rollouts; every step a fresh process (wall "
        f"from outside it, imports included; CPU-seconds of it and every process it started, Ray's included, read "
        f"before it exits, {COUNTED_BY[counted_by()]}); Ray workers at nice 0; {n_runs(repeats)}; "
        f"{load_average(load)}"
    )
    if retried:
        caption += f"; {len(retried)} step(s) run again after Ray's start timed out (30 s) on the busy machine"
    return Bench("start", caption, figures, {"runs": runs, "mib": mib, "retried": retried})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    if args.step:
        print(orjson.dumps(_step(args.step)).decode())
        return
    show(bench_start(repeats=args.repeats, workdir=args.workdir))


if __name__ == "__main__":
    main()
