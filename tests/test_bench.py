"""`pexec bench`: the shared figure format (project / baseline / ratio, min–median–max), the Markdown blocks it
writes (docs/reference/benchmarks.md), the driver's batched completion loop on real local Ray, and every bench run
once at small sizes so that its printing cannot rot (the figures themselves are not asserted: timings)."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import subprocess
import sys
import time
import types
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.perf import _processes, figures
from pipeline.apps.perf.driver import finish, one_wait_per_shard
from pipeline.apps.perf.figures import Bench, figure
from pipeline.apps.perf.registry import BENCHES, Entry
from pipeline.core.errors import LeaseLost, PexecError, ScoringFailed
from pipeline.scoring.driver import completed
from pipeline.storage.shards import InputFile, Shard

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def test_a_figure_is_project_baseline_and_their_paired_ratio_as_min_median_max():
    f = figure("checker", "steps/s", [30_000, 32_000, 31_000], "naive loop", [400, 500, 310])
    assert f.ratios == (75.0, 64.0, 100.0)  # paired per run, not min over min
    [row] = figures.rows([f])
    assert row == ["checker", "3", "30,000–31,000–32,000 steps/s", "310–400–500 steps/s (naive loop)", "64.0–75.0–100×"]


def test_a_figure_without_a_baseline_says_why_and_has_no_ratio():
    [row] = figures.rows([figure("peak RSS", "MiB", [512.0], "none: peak memory")])
    assert row == ["peak RSS", "1", "512 MiB", "none: peak memory", "–"]
    # a growth of about zero against a baseline: no ratio rather than a meaningless one
    [row] = figures.rows([figure("growth", "MiB", [0.0, 0.2], "old loop", [0.1, 0.3])])
    assert row[4] == "–"


def test_a_figure_refuses_a_baseline_measured_a_different_number_of_times():
    with pytest.raises(ValueError, match="different number of times"):
        figure("x", "s", [1.0, 2.0], "y", [1.0])
    with pytest.raises(ValueError, match="no measurement"):
        figure("x", "s", [], "none: nothing")


def test_the_markdown_block_is_replaced_in_place_and_only_its_own(tmp_path):
    bench = Bench(
        "demo", "a caption", [figure("a | b", "s", [1.0, 2.0, 3.0], "old", [2.0, 2.0, 2.0])], measured="2026-12-01"
    )
    readme = tmp_path / "benchmarks.md"
    readme.write_text(
        "intro\n<!-- bench:start demo -->\nold table\n<!-- bench:end demo -->\n"
        "<!-- bench:start other -->\nkept\n<!-- bench:end other -->\nend\n"
    )
    figures.replace_block(readme, bench)
    text = readme.read_text()
    assert figures.blocks(text) == {"demo": figures.markdown(bench), "other": "kept"}
    assert text.startswith("intro\n") and text.endswith("end\n")
    lines = figures.markdown(bench).splitlines()
    assert lines[0] == "_a caption; measured 2026-12-01_" and lines[2] == "| " + " | ".join(figures.HEADER) + " |"
    assert lines[4] == "| a \\| b | 3 | 1.00–2.00–3.00 s | 2.00–2.00–2.00 s (old) | 0.500–1.00–1.50× |"
    with pytest.raises(PexecError, match="no <!-- bench:start missing -->"):
        figures.replace_block(readme, Bench("missing", "c", bench.figures))


def test_a_figure_measured_with_its_cpu_time_is_followed_by_a_row_of_it():
    f = figure("raw → run", "rollouts/s", [100.0, 120.0], "1 CPU", [60.0, 60.0], cpu=[10.0, 12.0],
               baseline_cpu=[8.0, 8.0])  # fmt: skip
    wall, cpu = figures.rows([f])
    assert wall[0] == "raw → run" and cpu[0].startswith("↳ CPU time of the row above")
    assert cpu[1:] == ["2", "10.0–11.0–12.0 CPU-s", "8.00–8.00–8.00 CPU-s (1 CPU)", "1.25–1.38–1.50×"]
    [_, alone] = figures.rows([figure("start", "s", [5.0], "none: no baseline", cpu=[3.0])])
    assert alone[2:] == ["3.00 CPU-s", "none: the baseline's was not measured", "–"]
    assert len(figures.rows([figure("peak", "MiB", [1.0], "none: memory")])) == 1  # no CPU time, no row
    with pytest.raises(ValueError, match="CPU time measured a different number of times"):
        figure("x", "s", [1.0, 2.0], "y", [1.0, 1.0], cpu=[1.0])
    with pytest.raises(ValueError, match="a baseline's CPU time without"):
        figure("x", "s", [1.0], "y", [1.0], baseline_cpu=[1.0])


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep({})"


def test_the_cpu_time_of_a_child_counts_while_it_runs_and_once_reaped():
    before = _processes.cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(30)])
    try:
        deadline = time.monotonic() + 60
        while _processes.cpu_seconds(child.pid) < 0.6 and time.monotonic() < deadline:  # busy, then asleep
            time.sleep(0.1)
        assert _processes.cpu_seconds() - before >= 0.6  # alive: read from its /proc entry
    finally:
        child.kill()
        child.wait()
    assert _processes.cpu_seconds() - before >= 0.6  # reaped: in this process's children's time


@pytest.fixture(params=["cgroup", "tree"])
def counted_by(request, monkeypatch) -> str:
    """How a metered block counts CPU time: a cgroup of its own where this process may make one, else the process
    tree (forced here by offering no cgroup hierarchy)."""
    if request.param == "tree":
        monkeypatch.setattr(_processes, "_CGROUPS", ())
    else:
        with _processes._CpuGroup.entered() as group:  # made and left again, to find out
            if group is None:
                pytest.skip("this process may not make a cgroup (not root, or no writable hierarchy)")
    return str(request.param)


def test_a_metered_block_has_wall_cpu_load_and_niceness(counted_by):
    with _processes.metered(every=0.1) as meter:
        subprocess.run([sys.executable, "-c", BUSY.format(0.3)], check=True)
    usage = meter.usage
    assert usage is not None and usage.cpu_s >= 0.6 and usage.wall_s >= 0.9
    assert len(usage.load) >= 3 and all(x >= 0 for x in usage.load)
    # Ray's workers are counted apart (none here unless this process hosts a Ray: the suite's shared one)
    assert os.nice(0) in usage.nice and set(usage.ray_worker_nice) <= {0, 15}
    assert usage.counted_by == counted_by
    text = usage.text()
    assert {"cgroup": "CPU-s (every process it started, Ray's included, counted by the kernel in a cgroup); load",
            "tree": "CPU-s (the bench process and its descendants, read from /proc; Ray's workers that ended before it "
                    "are missed); load"}[counted_by] in text  # fmt: skip
    assert f"processes at nice {os.nice(0)}" in text


def test_a_metered_block_counts_an_orphan_and_reaps_it(tmp_path, counted_by):
    # A child that starts a busy grandchild and exits at once, as a driver leaves Ray's processes: the grandchild
    # is an orphan. Without a subreaper it would be adopted outside this process's tree, its CPU time lost.
    done = tmp_path / "done"
    burn = BUSY.format(0) + f"\nopen({str(done)!r}, 'w').close()"
    orphan = f"import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', {burn!r}]).pid)"
    mine = time.process_time()  # this process's own CPU, the meter's sampling included, is not the orphan's
    with _processes.metered(every=0.1) as meter:
        pid = int(subprocess.run([sys.executable, "-c", orphan], check=True, capture_output=True).stdout)
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # its file written, it exits
    mine = time.process_time() - mine
    assert meter.usage is not None and meter.usage.cpu_s - mine >= 0.6
    with pytest.raises(ChildProcessError):  # reaped at the block's end: no zombie left
        os.waitpid(pid, os.WNOHANG)


def test_counting_has_the_time_of_a_process_reaped_without_accounting(tmp_path, counted_by):
    # A parent that ignores SIGCHLD, as Ray's raylet treats its workers: its busy child is reaped by the kernel and
    # its time is added to no one's. Only the cgroup has it.
    done = tmp_path / "done"
    burn = BUSY.format(0) + f"\nopen({str(done)!r}, 'w').close()"
    parent = (f"import signal, subprocess, sys, time, pathlib\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
              f"subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
              f"while not pathlib.Path({str(done)!r}).exists(): time.sleep(0.05)\ntime.sleep(0.5)")  # fmt: skip
    with _processes.counting() as cpu:
        before, mine = cpu(), time.process_time()  # both count this process since it started
        subprocess.run([sys.executable, "-c", parent], check=True, timeout=120)
        counted = cpu() - before - (time.process_time() - mine)
    if counted_by == "cgroup":
        assert counted >= 0.6
    else:  # what the tree misses: the reason for the cgroup
        assert counted < 0.6
    assert _processes.counted_by() == counted_by


def test_pexec_bench_adds_what_the_run_cost_and_leaves_the_environment_as_it_was(monkeypatch):
    [niceness] = _processes.BENCH_ENVIRONMENT  # Ray's own name for it
    monkeypatch.delenv(niceness, raising=False)
    seen: list[str | None] = []

    def measure() -> Bench:
        seen.append(os.environ.get(niceness))
        return Bench("fake", "a caption", [figure("x", "s", [1.0], "none: a test")], measured="2026-12-01")

    fake = types.ModuleType("fake_bench")
    fake.measure = measure  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    bench = Entry("fake_bench:measure").run(None, None, None)
    assert seen == ["0"] and niceness not in os.environ  # Ray's workers at nice 0 during the run only
    assert bench.usage is not None
    caption = figures.markdown(bench).splitlines()[0]
    assert caption.startswith("_a caption; whole run: ") and caption.endswith("; measured 2026-12-01_")


# -- the driver's completion loop, on real local Ray ----------------------------------------------------------


@pytest.fixture
def local_ray(shared_ray):
    """The loop's tasks only need some local Ray: the shared one."""


FILE = InputFile("bench://test", "jsonl", None, 0, "0")


@pytest.fixture
def cancels(monkeypatch) -> list:
    """Calls of `ray.cancel`: a stopping loop must make none (in Ray 2.60 cancelling a task that is just
    finishing can abort the driver; pipeline.scoring.driver.completed)."""
    import ray  # here and in the tests on Ray, not when the suite is collected

    calls: list = []
    monkeypatch.setattr(ray, "cancel", lambda *args, **kwargs: calls.append(args))
    return calls


@pytest.mark.parametrize("loop", [completed, one_wait_per_shard])
def test_the_loop_retires_every_shard_once_within_the_window(local_ray, loop):
    import ray

    task = ray.remote(finish)
    in_flight, most = 0, 0

    def submit(shard):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        return task.remote(shard)

    shards = [Shard(FILE, i, i + 1) for i in range(300)]
    seen = []
    for shard, scored in loop(iter(shards), submit, 40, lambda: None):
        in_flight -= 1
        assert scored.report.shard == shard.key and scored.report.start == shard.start
        seen.append(shard.start)
    assert sorted(seen) == list(range(300)) and most == 40


def test_a_failed_task_stops_the_loop_naming_its_shard(local_ray, cancels):
    def fails_on_7(shard: Shard):  # defined here: pickled by value for the workers
        if shard.start == 7:
            raise ValueError("bad shard")
        return finish(shard)

    import ray

    task = ray.remote(max_retries=0)(fails_on_7)
    with pytest.raises(ScoringFailed, match=r"shard [0-9a-f]{16} \(bench://test \[7:8\]\) failed: .*bad shard"):
        for _ in completed((Shard(FILE, i, i + 1) for i in range(50)), task.remote, 8, lambda: None):
            pass
    assert cancels == []  # the tasks in flight run to their end


def test_a_lost_lease_stops_the_loop_at_once(local_ray, cancels):
    import ray

    task = ray.remote(finish)
    retired = 0

    def still_held():
        if retired >= 5:
            raise LeaseLost("taken over")

    with pytest.raises(LeaseLost):
        for _ in completed((Shard(FILE, i, i + 1) for i in range(200)), task.remote, 4, still_held):
            retired += 1
    assert retired < 10 and cancels == []  # checked after every wait, not once at the end; nothing cancelled


# -- every bench, once, small ----------------------------------------------------------------------------


def _check(bench: Bench, name: str) -> None:
    assert bench.name == name and bench.figures
    for f in bench.figures:
        assert all(math.isfinite(v) for v in f.project), f
        assert f.baseline_values is not None or f.baseline.startswith("none"), f  # a missing baseline says why
    block = figures.block(bench)
    assert figures.blocks(block) == {name: figures.markdown(bench)}
    figures.show(bench)


def _small(name: str, tmp_path: Path, shared: Path) -> Bench:
    """`shared`: a folder kept for the module (both nightly benches read the data the first one wrote there)."""
    if name == "replay":
        from pipeline.apps.perf.replay import bench_replay

        return bench_replay(300, 30, tmp_path, baseline_sample=20, cpus=(1,), repeats=1)
    if name == "metrics":
        from pipeline.apps.perf.metrics import bench_metrics

        return bench_metrics(2000, 200, B=20, workdir=tmp_path, cohorts=(2,), repeats=1)
    if name == "merged":
        from pipeline.apps.perf.merged import bench_merged

        return bench_merged(2000, B=20, shards=2, target_tasks=10_000, repeats=2)
    if name == "scale":
        from conftest import free_port

        from pipeline.apps.perf.scale import bench_scale

        return bench_scale(200, 20, port=free_port(), in_process=True)
    if name == "view":
        from pipeline.apps.perf.view import bench_view

        return bench_view(2000, tmp_path, repeats=2)
    if name == "guard":
        from pipeline.apps.perf.guard import bench_guard

        return bench_guard(sessions=3, concurrent=2, rounds=1, think_s=0.001, repeats=2)
    if name == "driver":
        from pipeline.apps.perf.driver import bench_driver

        return bench_driver(windows=(4, 16), steady=32, repeats=1, rollouts=40, distinct_ids=1000)
    if name == "distributed":
        from pipeline.apps.perf.distributed import bench_distributed

        return bench_distributed(20_000, per_shard=1000, B=20, workdir=tmp_path, in_process=True)
    if name == "start":
        from pipeline.apps.perf.start import bench_start

        return bench_start(sizes=(40, 80), repeats=1, workdir=tmp_path)
    if name == "spans":
        from pipeline.apps.perf.spans import bench_spans

        return bench_spans(2000, tmp_path, shard_mb=0.05, repeats=1)
    if name == "parts":
        from pipeline.apps.perf.parts import bench_parts

        return bench_parts(4000, tmp_path, shard_mb=0.05, repeats=1)
    if name == "split":
        from pipeline.apps.perf.split import bench_split

        return bench_split(400, None, repeats=1, shard_mb=0.1, in_process=True)  # its own folder, then removed
    if name.startswith("nightly"):
        from pipeline.apps.perf.nightly import bench_nightly, bench_nightly_otel

        measure = bench_nightly if name == "nightly" else bench_nightly_otel
        return measure(40, eval_mb=0.01, workdir=shared, files=2, shard_mb=0.1, B=20, in_process=True)
    if name == "raw":
        from pipeline.apps.perf.raw import bench_raw

        return bench_raw(200, tmp_path, repeats=1)
    if name == "bfcl":
        from pipeline.apps.perf.bfcl import bench_bfcl

        return bench_bfcl(repeats=1)
    from pipeline.apps.perf.tau import bench_tau

    return bench_tau(str(DATA / "real" / "tau2"), repeats=1, passes=1)  # against c0f23f9 when git has it


@pytest.fixture(scope="module")
def bench_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-data")


@pytest.mark.server  # some benches start moto's S3 or a `pexec guard serve`
@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_runs_and_prints(name, tmp_path, bench_data, monkeypatch, shared_ray):
    """Each bench on a small size, on the shared Ray (a bench given a running Ray uses it: the code paths run,
    the CPU limits and Ray's start-up are not measured)."""
    monkeypatch.chdir(ROOT)
    bench = _small(name, tmp_path, bench_data)
    _check(bench, name)
    if name.startswith("nightly"):
        _check_nightly(bench, "otel" if name == "nightly_otel" else "openai")
    if name == "split":
        _check_split(bench)


def _check_split(bench: Bench) -> None:
    """The one file was cut into ranges, every run scored every rollout written, and the ratios are paired."""
    runs = bench.details["runs"]
    assert set(runs) == {"1", "2"}
    assert all(r["count"] == bench.details["rollouts"] and r["shards"] > 2 for rs in runs.values() for r in rs)
    assert all(r["cpu_seconds"] > 0 and r["task_seconds"] > 0 for rs in runs.values() for r in rs)
    assert all(f.ratios for f in bench.figures if f.baseline_values is not None)


def _check_nightly(bench: Bench, fmt: str) -> None:
    """Every path scored (or read) every rollout written, the paired ratios are there, and the projection is the
    arithmetic of the rates measured."""
    from pipeline.apps.perf.nightly import TASK_BOUND_MIB, Stages, projected_seconds

    runs, n = bench.details["runs"], bench.details["rollouts"]
    evals = {"eval pexec", "eval inspect"} if fmt == "openai" else set()  # the .eval is read with the OpenAI form
    assert set(runs) == {f"{fmt} {what}" for what in ("raw 1", "raw 2", "ingest", "store 2")} | {"metrics 1"} | evals
    assert all(r["count"] == n for k, rs in runs.items() if not k.startswith("eval") for r in rs)
    if evals:
        assert runs["eval pexec"][0]["count"] == runs["eval inspect"][0]["count"] > 0
    assert max(r["worker_mib"] for k in (f"{fmt} raw 1", f"{fmt} raw 2") for r in runs[k]) <= TASK_BOUND_MIB
    paired = [f for f in bench.figures if "end to end" in f.name or f.unit == "samples/s"]
    assert len(paired) == 1 + len(evals) // 2 and all(f.ratios for f in paired)

    def per_core(key: str) -> float:
        r = runs[key][0]
        return r["count"] / r["seconds"] / r["cpus"]

    expected = projected_seconds(Stages(per_core(f"{fmt} raw 1"), per_core("metrics 1")))
    assert bench.details["projected_s"] == {fmt: [pytest.approx(expected)]}
    [projection] = [f for f in bench.figures if f.name.startswith("projection")]
    assert projection.project == tuple(bench.details["projected_s"][fmt])


def test_the_nightly_projection_adds_the_stages_at_their_per_core_rates():
    from pipeline.apps.perf.nightly import Stages, projected_seconds

    # 100M rollouts on 2,048 cores: 1,000/s per core end to end, 10,000/s per core for the metrics.
    assert projected_seconds(Stages(1000, 10_000)) == pytest.approx(1e8 / 2048 / 1000 + 1e8 / 2048 / 10_000)
    assert projected_seconds(Stages(500, 1e12), rollouts=1000, cores=2) == pytest.approx(1.0)


def test_the_tau_bench_without_its_baseline_revision_says_why():
    from pipeline.apps.perf.tau import bench_tau

    bench = bench_tau(str(DATA / "real" / "tau2"), repeats=1, passes=1, baseline="0123456789abcdef")
    speed = bench.figures[0]
    assert speed.baseline_values is None
    assert speed.baseline.startswith("none: 0123456789abcdef could not be taken from this checkout's git history")
    assert bench.details["project"][0]["steps"] == 2661  # every step of the 290 real rollouts, replayed


def test_the_cli_prints_the_markdown_block(tmp_path):
    result = CliRunner().invoke(app, ["bench", "merged", "--rollouts", "20000", "--repeats", "2", "--markdown"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("<!-- bench:start merged -->\n_") and "| figure | runs |" in result.stdout
    today = datetime.now(UTC).date().isoformat()  # the caption dates the figures
    assert result.stdout.splitlines()[1].endswith(f"; measured {today}_"), result.stdout
    readme = tmp_path / "benchmarks.md"
    readme.write_text("<!-- bench:start merged -->\nx\n<!-- bench:end merged -->\n")
    result = CliRunner().invoke(app, ["bench", "merged", "--rollouts", "20000", "--readme", str(readme)])
    assert result.exit_code == 0, result.output
    assert "| figure | runs |" in figures.blocks(readme.read_text())["merged"]


def test_a_registered_bench_gets_rollouts_as_its_size_and_only_the_settings_given(monkeypatch):
    calls: list[dict] = []
    fake = types.ModuleType("fake_bench")
    fake.measure = lambda **kwargs: calls.append(kwargs)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    Entry("fake_bench:measure", "n_tasks", 1000, per_unit=10, workdir=True).run(None, None, None)
    Entry("fake_bench:measure", "n_tasks", 1000, per_unit=10, workdir=True).run(500, Path("w"), 2)
    Entry("fake_bench:measure").run(500, Path("w"), None)  # a fixed-size bench ignores --rollouts and --workdir
    assert calls == [{"n_tasks": 100, "workdir": None}, {"n_tasks": 50, "workdir": Path("w"), "repeats": 2}, {}]


def test_every_registered_bench_takes_the_arguments_its_entry_passes():
    for name, entry in BENCHES.items():
        module, _, function = entry.function.partition(":")
        takes = inspect.signature(getattr(importlib.import_module(module), function)).parameters
        passed = ["repeats", *([entry.size] if entry.size else []), *(["workdir"] if entry.workdir else [])]
        assert set(passed) <= set(takes), (name, passed, list(takes))


def test_the_nightly_benchs_protobuf_spans_read_as_its_json_spans(tmp_path):
    """The same conversations written as OTLP JSON lines and by the SDK's protobuf encoder ingest to the same
    rollouts, every conversation whole."""
    from pipeline.ingest import ingest
    from pipeline.synthetic.support_spans import write_spans

    counts = {e: write_spans(tmp_path / e, 12, files=3, encoding=e) for e in ("json", "proto")}
    assert counts["json"] == counts["proto"] > 12
    assert sorted(p.suffix for p in (tmp_path / "proto").iterdir()) == [".pb"] * 3
    read = {e: sorted(ingest("otel", [str(tmp_path / e)]), key=lambda r: r["rollout_id"]) for e in counts}
    assert len(read["json"]) == 12 and read["proto"] == read["json"]
