"""A night of production logs scored where they lie (`pexec bench nightly`, `python -m pipeline.apps.perf.nightly`).

In one run, on a moto S3 server on loopback:
  - the support sample's conversations (`pipeline.synthetic.support_logs`) as gzip OpenAI JSON Lines files, and
    the same conversations as OTLP protobuf spans (`pipeline.synthetic.support_spans`, the SDK's encoder), each
    dealt over several files, scored raw → committed run by the distributed path (`pexec score s3://… --format
    FMT`: the adapter inside the Ray tasks, the hash shuffle for spans) with Ray limited to 1 and then 2 CPUs;
  - against today's ingest-then-score of the same files: `pexec ingest FMT` (one process) to a canonical store on
    S3, then `pexec score` of the store on 2 CPUs;
  - the metrics of the scored OpenAI run computed in Ray tasks (`pexec metrics` on a cluster), for the projection;
  - an Inspect `.eval` log (`pipeline.synthetic.support_eval`, Inspect's own writer) read by pexec's `inspect`
    adapter and by `inspect_ai.log.read_eval_log`.
Every measured step is a fresh process (`python -m pipeline.apps.perf.nightly STEP …`) reporting its seconds, its
CPU-seconds (its own and those of every process it started, Ray's included, read before it exits), its own peak
RSS (VmHWM) and, for scoring, the largest scoring task's own peak from the shard reports (its worker's VmHWM,
restarted as the task began: pipeline.scoring.memory). The projection to 100M
rollouts on 128 × 16 cores is computed from the per-core rates measured here (`projected_seconds`).
Progress lines go to stderr; the data goes under --workdir.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

import orjson

from pipeline.apps.perf import CLUSTER_CORES, CLUSTER_ROLLOUTS, require_dev
from pipeline.apps.perf._processes import COUNTED_BY, counted_by, counting, local_ray, moto_server
from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, replace_block, show
from pipeline.scoring.memory import peak_mib

if TYPE_CHECKING:
    from pipeline.ingest import IngestOptions

FORMATS = {  # format: (its files' folder, the adapter options the support sample needs)
    "openai": ("openai", {"error_prefix": "Error:"}),
    "otel": ("otel", {}),
}
NAMES = {"openai": "OpenAI gzip JSON Lines", "otel": "OTLP protobuf spans (shuffled)"}
DEFAULT_ROLLOUTS = 1_000_000
# The memory a scoring task stays under, whatever the night's size: a task holds one shard, or decodes the shuffle
# partitions of its run one at a time (about `shard_mb` of input each), never the night.
TASK_BOUND_MIB = 1024
EVAL_MB_PER_MILLION = 300  # the .eval size when not given: 300 MB at the default million rollouts
BUCKET = "nightly"
WRITTEN = "written.json"  # in the data folder: what was written there, by which code (see bench_nightly)


@dataclass(frozen=True)
class Stages:
    """Per-core rates measured on this machine, the inputs of the cluster projection."""

    end_to_end: float  # rollouts/s per core, raw logs → committed run (reading, shuffle, scoring, id check)
    metrics: float  # rollouts/s per core of the distributed poisson-merged metrics


def projected_seconds(stages: Stages, rollouts: int = CLUSTER_ROLLOUTS, cores: int = CLUSTER_CORES) -> float:
    """Seconds for `rollouts` raw rollouts on `cores` cores, each stage's per-core rate scaled linearly with the
    cores, the stages one after another (the metrics read the committed run)."""
    return rollouts / (cores * stages.end_to_end) + rollouts / (cores * stages.metrics)


class Step(TypedDict):
    """What one measured step reports: its seconds, the rollouts it read or scored, its CPUs."""

    seconds: float
    count: int
    cpus: int
    worker_mib: NotRequired[float]  # scoring: the largest Ray worker's peak RSS


class Measured(Step):
    peak_mib: float  # the step's process
    cpu_s: float  # the step's process and its children, Ray's included


def bench_nightly(
    rollouts: int = DEFAULT_ROLLOUTS,
    eval_mb: float | None = None,
    workdir: Path | None = None,
    files: int = 8,
    shard_mb: float = 16,
    B: int = 1000,
    repeats: int = 1,
    in_process: bool = False,
    formats: tuple[str, ...] = ("openai",),
    eval_log: bool = True,
) -> Bench:
    """The night as OpenAI logs and the `.eval` log (`nightly`); `bench_nightly_otel` measures the same night as
    spans. `in_process`: every step in this process and its one Ray (the code paths only, for tests: the CPU limits
    and the peaks are then not each step's own). `formats`: the forms of the logs measured, `eval_log`: whether the
    `.eval` is read too; the data of every form is written either way."""
    if not formats or set(formats) - set(FORMATS):
        raise ValueError(f"formats: one or more of {', '.join(FORMATS)}, not {', '.join(formats) or 'none'}")
    for name in ("moto", "inspect_ai", "opentelemetry.exporter.otlp.proto.common"):
        require_dev(name, "`pexec bench nightly`")
    load = os.getloadavg()[0]
    eval_mb = eval_mb if eval_mb is not None else max(1.0, EVAL_MB_PER_MILLION * rollouts / 1_000_000)
    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-nightly-"))
    data = root / "data"
    eval_path = data / "support.eval"
    # Writing a million conversations three ways takes half an hour: a --workdir keeps them for the next run of
    # the same size written by the same code, and says so.
    wanted = {"rollouts": rollouts, "files": files, "eval_mb": eval_mb, "writers": _writers_digest()}
    written = _written(data)
    if written is not None and {k: written.get(k) for k in wanted} == wanted:
        _progress(f"reusing the data written at {written['at']} in {data}")
        spans, eval_samples = written["spans"], written["eval_samples"]
    else:
        shutil.rmtree(data, ignore_errors=True)
        _progress(f"writing {rollouts:,} conversations as gzip OpenAI JSON Lines and as OTLP protobuf spans "
                  f"({files} files each), and an Inspect .eval log of {eval_mb:g} MiB")  # fmt: skip
        spans, eval_samples = _write_data(data, rollouts, files, eval_mb, side_by_side=not in_process)
        at = time.strftime("%Y-%m-%d %H:%M")
        (data / WRITTEN).write_bytes(orjson.dumps({**wanted, "spans": spans, "eval_samples": eval_samples, "at": at}))
    sizes = {fmt: sum(p.stat().st_size for p in (data / fmt).iterdir()) for fmt in FORMATS}
    sizes["eval"] = eval_path.stat().st_size
    runs: dict[str, list[Measured]] = {}

    def add(key: str, *args: object) -> Measured:
        _progress(f"{key}: {' '.join(str(a) for a in args[:2])} …")
        argv = [str(a) for a in args]
        result = _run_step(argv) if in_process else _fresh(*argv)
        _progress(f"{key}: {result['seconds']:.1f} s, peak {result['peak_mib']:.0f} MiB")
        runs.setdefault(key, []).append(result)
        return result

    try:
        with moto_server(needed_by="`pexec bench nightly`") as endpoint:
            import s3fs

            s3 = s3fs.S3FileSystem(endpoint_url=endpoint)
            s3.mkdir(BUCKET)
            for fmt in formats:
                s3.put(str(data / fmt) + "/", f"{BUCKET}/raw/{fmt}/", recursive=True)
            for _ in range(repeats):
                for fmt in formats:
                    raw = f"s3://{BUCKET}/raw/{FORMATS[fmt][0]}/"
                    for cpus in (1, 2):
                        add(f"{fmt} raw {cpus}", "score", fmt, raw, f"s3://{BUCKET}/run-{fmt}-{cpus}", cpus, shard_mb,
                            endpoint)  # fmt: skip
                    store = f"s3://{BUCKET}/store-{fmt}"
                    if s3.exists(store):
                        s3.rm(store, recursive=True)
                    add(f"{fmt} ingest", "ingest", fmt, raw, store, endpoint)
                    add(f"{fmt} store 2", "score", "canonical", store, f"s3://{BUCKET}/run-{fmt}-store", 2, shard_mb,
                        endpoint)  # fmt: skip
                add("metrics 1", "metrics", f"s3://{BUCKET}/run-{formats[0]}-2", 1, B, endpoint)
        for _ in range(repeats if eval_log else 0):
            add("eval pexec", "eval-pexec", eval_path)
            add("eval inspect", "eval-inspect", eval_path)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    for key, results in runs.items():
        expected = eval_samples if key.startswith("eval") else rollouts
        for r in results:
            if r["count"] != expected:
                raise AssertionError(f"{key}: {r['count']:,} rollouts read or scored, {expected:,} written")
    eval_mib = sizes["eval"] / 2**20
    eval_text = f"an Inspect `.eval` log of {eval_samples:,} samples, {eval_mib:,.1f} MiB (Inspect's own writer)"
    return _bench(runs, formats, rollouts, spans, sizes, eval_text if eval_log else "", files, shard_mb, B, repeats,
                  load)  # fmt: skip


def bench_nightly_otel(rollouts: int = DEFAULT_ROLLOUTS, workdir: Path | None = None, repeats: int = 1,
                       **kwargs: Any) -> Bench:  # fmt: skip
    """The same night as OTLP protobuf spans, whose conversations are assembled by the hash shuffle (over an hour at
    the default size on 2 cores, hence a bench of its own)."""
    return bench_nightly(rollouts, workdir=workdir, repeats=repeats, formats=("otel",), eval_log=False, **kwargs)


def _bench(runs: dict[str, list[Measured]], formats: tuple[str, ...], rollouts: int, spans: int,
           sizes: dict[str, int], eval_text: str, files: int, shard_mb: float, B: int, repeats: int,
           load: float) -> Bench:  # fmt: skip
    def v(key: str, field: Literal["seconds", "peak_mib", "worker_mib", "cpu_s"] = "seconds") -> list[float]:
        return [r[field] for r in runs[key]]

    def rate(key: str, per_core: bool = False) -> list[float]:
        return [r["count"] / r["seconds"] / (r["cpus"] if per_core else 1) for r in runs[key]]

    figures = []
    names = {fmt: NAMES[fmt] for fmt in formats}
    projections = {}
    for fmt, name in names.items():
        one, two = rate(f"{fmt} raw 1"), rate(f"{fmt} raw 2")
        baseline = [rollouts / (i + s) for i, s in zip(v(f"{fmt} ingest"), v(f"{fmt} store 2"), strict=True)]
        baseline_cpu = [i + s for i, s in zip(v(f"{fmt} ingest", "cpu_s"), v(f"{fmt} store 2", "cpu_s"), strict=True)]
        stages = [Stages(r, m) for r, m in zip(rate(f"{fmt} raw 1", True), rate("metrics 1", True), strict=True)]
        projections[fmt] = [projected_seconds(s) for s in stages]
        figures += [
            figure(f"{name}: raw → run, rollouts/s per core, 2 CPUs", "rollouts/s", rate(f"{fmt} raw 2", True),
                   "1 CPU", rate(f"{fmt} raw 1", True), cpu=v(f"{fmt} raw 2", "cpu_s"),
                   baseline_cpu=v(f"{fmt} raw 1", "cpu_s")),
            figure(f"{name}: speed-up 1 → 2 CPUs (target ≥ 1.7×)", "×", [b / a for a, b in zip(one, two, strict=True)],
                   "none: 2-CPU over 1-CPU rollouts/s, same run"),
            figure(f"{name}: raw → run end to end on 2 CPUs (target ≥ 1.5×)", "rollouts/s", two,
                   f"ingest {fmt} (one process) to an S3 store, then score it on 2 CPUs", baseline,
                   cpu=v(f"{fmt} raw 2", "cpu_s"), baseline_cpu=baseline_cpu),
            figure(f"{name}: driver peak RSS, raw on 2 CPUs", "MiB", v(f"{fmt} raw 2", "peak_mib"),
                   "the ingest process", v(f"{fmt} ingest", "peak_mib")),
            figure(f"{name}: largest Ray worker peak RSS, raw on 2 CPUs (stated bound {TASK_BOUND_MIB:,} MiB)",
                   "MiB", v(f"{fmt} raw 2", "worker_mib"), "scoring the ingested store", v(f"{fmt} store 2",
                   "worker_mib")),
        ]  # fmt: skip
    if eval_text:
        figures.append(figure("reading the `.eval` log, samples → rollouts (target ≥ 3×)", "samples/s",
                              rate("eval pexec"), "inspect_ai's read_eval_log", rate("eval inspect"),
                              cpu=v("eval pexec", "cpu_s"), baseline_cpu=v("eval inspect", "cpu_s")))  # fmt: skip
        figures.append(figure(".eval reading: peak RSS", "MiB", v("eval pexec", "peak_mib"), "read_eval_log",
                              v("eval inspect", "peak_mib")))  # fmt: skip
    for fmt, name in names.items():
        figures.append(figure(
            f"projection: {CLUSTER_ROLLOUTS / 1e6:,.0f}M raw rollouts ({name}) on 128 × 16 cores (target < 300 s)",
            "s", projections[fmt],
            f"none: computed, not measured: {CLUSTER_CORES:,} cores × the 1-CPU per-core rate raw → run (reading, "
            f"{'shuffle, ' if fmt == 'otel' else ''}scoring, distributed id check; Ray start-up included) then the "
            "per-core rate of the distributed metrics; scaling assumed linear per core, S3 bandwidth and the "
            "driver's planning not included"))  # fmt: skip
    size = "" if rollouts >= DEFAULT_ROLLOUTS else f" (below the default {DEFAULT_ROLLOUTS:,}: a small run)"
    forms = {"openai": f"{sizes['openai'] / 2**20:,.1f} MiB of gzip OpenAI JSON Lines",
             "otel": f"{spans:,} spans ({sizes['otel'] / 2**20:,.0f} MiB of OTLP protobuf)"}  # fmt: skip
    caption = (
        f"{rollouts:,} support conversations{size} on a moto S3 server on loopback: "
        f"{' and '.join(forms[f] for f in formats)}, {files} files{' each' if len(formats) > 1 else ''}, shards of "
        f"{shard_mb:g} MiB; metrics B = {B}; {eval_text + '; ' if eval_text else ''}every step a fresh process (Ray "
        f"start-up included; its CPU-seconds and those of every process it started, {COUNTED_BY[counted_by()]}); "
        f"{n_runs(repeats)}; {load_average(load)}"
    )
    name = "nightly" if formats == ("openai",) else "nightly_" + "_".join(formats)
    return Bench(name, caption, figures, {"runs": runs, "projected_s": projections, "rollouts": rollouts})


def _progress(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} bench nightly: {text}", file=sys.stderr, flush=True)


def _fresh(*args: str) -> Measured:
    """One measured step in a fresh process: its last stdout line, as JSON."""
    out = subprocess.run([sys.executable, "-m", "pipeline.apps.perf.nightly", *args], check=True,
                         stdout=subprocess.PIPE, text=True).stdout  # fmt: skip
    measured: Measured = orjson.loads(out.strip().splitlines()[-1])  # _run_step's, from that process
    return measured


# --- the measured steps, each run in a process of its own ------------------------------------------------


def _options(fmt: str, endpoint: str | None) -> IngestOptions:
    from pipeline.ingest import IngestOptions

    so = {"endpoint_url": endpoint} if endpoint else None
    return IngestOptions(extra=dict(FORMATS[fmt][1]), storage_options=so)


def _score(fmt: str, source: str, run: str, cpus: int, shard_mb: float, endpoint: str) -> Step:
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings

    options = dict(FORMATS[fmt][1]) if fmt in FORMATS else {}  # a canonical store is read as is
    settings = ScoreSettings(env="observed", spec="support", num_cpus=cpus, shard_mb=shard_mb, force=True,
                             format=fmt, options=options, storage_options={"endpoint_url": endpoint})  # fmt: skip
    began = time.perf_counter()
    manifest = run_scoring(source, run, settings)
    return {"seconds": time.perf_counter() - began, "count": manifest.counts.scored, "cpus": cpus,
            "worker_mib": max(s.peak_rss_mib for s in manifest.shards)}  # fmt: skip


def _ingest(fmt: str, source: str, store: str, endpoint: str) -> Step:
    """`pexec ingest FMT SOURCE --out STORE` as the command runs it: the shards decoded here, one after another."""
    from pipeline.ingest import checked
    from pipeline.ingest.sharded import raw_source
    from pipeline.scoring.convert import Executor, converted
    from pipeline.storage.stores import write_store

    began = time.perf_counter()
    raw = raw_source(fmt, [source], _options(fmt, endpoint))
    records = checked(fmt, converted(raw, Executor("inline"), f"{store}/.shuffle"), raw.allow_no_calls, validate=False)
    n = write_store(records, store, "jsonl", storage_options={"endpoint_url": endpoint})
    return {"seconds": time.perf_counter() - began, "count": n, "cpus": 1}


def _metrics(run: str, cpus: int, B: int, endpoint: str) -> Step:
    from pipeline.metrics.partials import metrics_on_ray
    from pipeline.metrics.run import open_run
    from pipeline.metrics.settings import BootstrapSettings

    with local_ray(cpus) as address:  # in process (tests), the Ray scoring started is used
        began = time.perf_counter()
        snapshot = open_run(run, {"endpoint_url": endpoint}).snapshot
        metrics_on_ray(snapshot, address, settings=BootstrapSettings(B=B, method="poisson-merged"))
        seconds = time.perf_counter() - began
    return {"seconds": seconds, "count": _scored(run, endpoint), "cpus": cpus}


def _write_data(data: Path, rollouts: int, files: int, eval_mb: float, side_by_side: bool) -> tuple[int, int]:
    """The bench's three inputs, written by processes side by side (a million conversations: half an hour one
    after the other); returns the spans and the .eval samples written."""
    from pipeline.synthetic.support_eval import write_eval
    from pipeline.synthetic.support_logs import write_night
    from pipeline.synthetic.support_spans import write_spans

    night = functools.partial(write_night, data / "openai", rollouts, files)
    spans = functools.partial(write_spans, data / "otel", rollouts, files, encoding="proto")
    samples = functools.partial(write_eval, data / "support.eval", eval_mb)
    if not side_by_side:
        night()
        return spans(), samples()
    context = multiprocessing.get_context("spawn")  # no state of this process (Ray, threads) in the writers
    with ProcessPoolExecutor(max_workers=min(3, os.cpu_count() or 1), mp_context=context) as pool:
        written = pool.submit(night), pool.submit(spans), pool.submit(samples)
        written[0].result()
        return written[1].result(), written[2].result()


def _writers_digest() -> str:
    """A hash of the modules that write the bench's data: data written by other code is written again."""
    import hashlib

    from pipeline.synthetic import support_eval, support_logs, support_spans

    digest = hashlib.sha256()
    for module in (support_logs, support_spans, support_eval):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()[:12]


def _written(data: Path) -> dict[str, Any] | None:
    try:
        return dict(orjson.loads((data / WRITTEN).read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return None


def _scored(run: str, endpoint: str) -> int:
    from pipeline.storage.run import RunPrefix, read_manifest

    manifest = read_manifest(RunPrefix(run, {"endpoint_url": endpoint}))
    if manifest is None:
        raise FileNotFoundError(f"{run} has no manifest")
    return manifest.counts.scored


def _eval_pexec(path: str) -> Step:
    from pipeline.ingest import ingest

    began = time.perf_counter()
    n = sum(1 for _ in ingest("inspect", [path]))
    return {"seconds": time.perf_counter() - began, "count": n, "cpus": 1}


def _eval_inspect(path: str) -> Step:
    from inspect_ai.log import read_eval_log

    began = time.perf_counter()
    n = len(read_eval_log(path).samples or [])
    return {"seconds": time.perf_counter() - began, "count": n, "cpus": 1}


STEPS: dict[str, Callable[..., Step]] = {"score": _score, "ingest": _ingest, "metrics": _metrics,
                                         "eval-pexec": _eval_pexec, "eval-inspect": _eval_inspect}  # fmt: skip
_TYPES: dict[str, Callable[[str], object]] = {"cpus": int, "B": int, "shard_mb": float}


def _run_step(argv: list[str]) -> Measured:
    """STEP ARG… -> the step's measurements, this process's peak RSS and the CPU-seconds of it and of every process
    it started (`counting`)."""
    step = STEPS[argv[0]]
    names = list(inspect.signature(step).parameters)
    with counting() as cpu:
        result = step(*(_TYPES.get(n, str)(a) for n, a in zip(names, argv[1:], strict=True)))
        return {**result, "peak_mib": peak_mib(), "cpu_s": cpu()}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in STEPS:
        print(orjson.dumps(_run_step(argv)).decode())
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=DEFAULT_ROLLOUTS)
    parser.add_argument("--eval-mb", type=float, help="size of the .eval log (default: 300 MiB per million rollouts)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--otel", action="store_true", help="the night as OTLP protobuf spans (bench nightly_otel)")
    parser.add_argument("--readme", type=Path, help="replace the bench's block in this Markdown file")
    args = parser.parse_args(argv)
    if args.otel:
        result = bench_nightly_otel(args.rollouts, args.workdir, args.repeats, eval_mb=args.eval_mb)
    else:
        result = bench_nightly(args.rollouts, args.eval_mb, args.workdir, repeats=args.repeats)
    show(result)
    if args.readme is not None:
        replace_block(args.readme, result)


if __name__ == "__main__":
    main()
