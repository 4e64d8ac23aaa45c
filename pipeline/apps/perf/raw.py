"""Raw logs to a committed run in one process (`pexec bench raw`, `python -m pipeline.apps.perf.raw`): the nightly
bench's OpenAI logs (`pipeline.synthetic.support_logs.write_night`, gzip JSON Lines) scored by `pexec score --format
openai --inline` in a fresh process, beside the rate of reading, gunzipping and orjson-decoding every line of the
same files in this process (the floor any reader pays), measured in the same run.

Every rate is per CPU-second (user + system of the process that did the work: stable on a shared machine where
wall time is not). The stages of the inline path are timed in this process on the same conversations: the logs
read, decoded and converted by the adapter into checked rollouts (the model's objects), the checker with every
check on, and the steps and rollouts tables built from them.
"""

from __future__ import annotations

import gc
import gzip
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from pipeline.apps.perf.figures import Bench, Figure, figure, load_average, n_runs, show
from pipeline.storage.run import read_manifest

OPTIONS = {"error_prefix": "Error:"}  # what the support sample's logs need (as the nightly bench gives them)
FILES = 8


@dataclass(frozen=True)
class RawRun:
    """One repetition, each a rate per CPU-second."""

    inline: float  # rollouts: `pexec score --inline` raw -> committed run, the whole command
    orjson: float  # rollouts: gunzip + orjson of every line
    adapter: float  # rollouts: the shards read, decoded and converted to checked Rollouts (the format's reader)
    checker: float  # steps: replay with every check on
    tables: float  # rollouts: steps and rollouts tables
    steps_per_rollout: float


def bench_raw(rollouts: int = 100_000, workdir: Path | None = None, repeats: int = 3) -> Bench:
    from pipeline.synthetic.support_logs import write_night

    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-raw-"))
    logs = root / "openai"
    shutil.rmtree(logs, ignore_errors=True)
    write_night(logs, rollouts, FILES)
    load = os.getloadavg()[0]
    runs = [_run(logs, root / "run", rollouts) for _ in range(repeats)]
    size = sum(f.stat().st_size for f in logs.iterdir())
    caption = (
        f"{rollouts:,} conversations of the nightly bench's OpenAI logs ({FILES} gzip JSON Lines files, "
        f"{size / 2**20:,.1f} MiB), observed environment with the `support` spec; rates per CPU-second; "
        f"{n_runs(repeats)}; {load_average(load)}"
    )
    return Bench("raw", caption, _figures(runs), {"runs": [asdict(r) for r in runs]})


def _run(logs: Path, run: Path, rollouts: int) -> RawRun:
    shutil.rmtree(run, ignore_errors=True)
    options = [f"--option={k}={v}" for k, v in OPTIONS.items()]
    command = [sys.executable, "-m", "pipeline.apps.cli", "score", str(logs), "--format", "openai", *options,
               "--env", "observed", "--spec", "support", "--inline", "--out", str(run)]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    manifest = read_manifest(str(run))
    counts = manifest.counts if manifest is not None else None
    if counts is None or counts.scored != rollouts or counts.rejected:  # a rate over rejects would flatter pexec
        raise RuntimeError(f"bench raw: not every one of {rollouts:,} rollouts was scored: {counts}")
    inline = rollouts / (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return RawRun(inline=inline, orjson=rollouts / _cpu(lambda: _parse_all(logs)), **_stages(logs))


def _parse_all(logs: Path) -> None:
    for path in sorted(logs.iterdir()):
        with gzip.open(path, "rb") as f:
            for line in f:
                orjson.loads(line)


def _stages(logs: Path) -> dict[str, float]:
    """The inline path's stages, timed one after another over every conversation."""
    from pipeline.core.model import Rollout, RolloutResult
    from pipeline.core.records import check_rollout
    from pipeline.envs import EnvOptions, get_environment
    from pipeline.ingest import IngestOptions
    from pipeline.ingest.openai import FORMAT
    from pipeline.ingest.sharded import plan_raw, raw_source
    from pipeline.replay.checker import replay
    from pipeline.scoring.run_tables import rollouts_table, steps_table

    source = raw_source("openai", [str(logs)], IngestOptions(extra=dict(OPTIONS)))
    shards = plan_raw(source, 64 * 2**20)
    rollouts: list[Rollout] = []
    adapter = _cpu(lambda: rollouts.extend(check_rollout(r) for s in shards for _, r in FORMAT.read_rollouts(s,
                   source.options) if isinstance(r, Rollout)))  # fmt: skip
    env = get_environment("observed", EnvOptions(spec="support"))
    results: list[RolloutResult] = []
    checker = _cpu(lambda: results.extend(replay(env, r) for r in rollouts))
    batch = 250  # as a scoring task converts them
    tables = _cpu(lambda: [(steps_table("run", results[i : i + batch]), rollouts_table("run", results[i : i + batch]))
                           for i in range(0, len(results), batch)])  # fmt: skip
    steps = sum(r.T for r in results)
    n = len(rollouts)
    return {"adapter": n / adapter, "checker": steps / checker, "tables": n / tables, "steps_per_rollout": steps / n}


def _cpu(work: object) -> float:
    """CPU-seconds of this process spent in `work()`. What the earlier stages made is frozen out of the cyclic
    collector's sight first: a scoring task holds a batch of them, not the whole run, and the collector would
    otherwise charge each stage for scanning every object made before it."""
    assert callable(work)
    gc.collect()
    gc.freeze()
    try:
        began = time.process_time()
        work()
        return time.process_time() - began
    finally:
        gc.unfreeze()


def _figures(runs: list[RawRun]) -> list[Figure]:
    parse = "gunzip + orjson of every line"
    orjson_rates = [r.orjson for r in runs]
    return [
        figure("raw → run, `pexec score --format openai --inline` (the whole command)", "rollouts/CPU-s",
               [r.inline for r in runs], parse, orjson_rates),
        figure("stage: read, decoded and converted to checked Rollouts", "rollouts/CPU-s", [r.adapter for r in runs],
               parse, orjson_rates),
        figure("stage: checker in-process, all checks on", "steps/CPU-s", [r.checker for r in runs],
               "none: the earlier checker is not kept (its paired runs: docs/reference/benchmarks.md)"),
        figure("stage: steps and rollouts tables", "rollouts/CPU-s", [r.tables for r in runs], parse, orjson_rates),
    ]  # fmt: skip


if __name__ == "__main__":
    show(bench_raw(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
