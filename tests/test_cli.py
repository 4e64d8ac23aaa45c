"""The `pexec` command line: the real console script in a subprocess (through local Ray), and its errors."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import starts
from typer.testing import CliRunner

import pipeline.apps.cli._scoring
import pipeline.metrics.run
from pipeline.apps.cli import app
from pipeline.core.errors import PexecError

ROOT = Path(__file__).resolve().parents[1]
PEXEC = str(Path(sys.executable).with_name("pexec"))
# The console script imports `pipeline` from this checkout, whichever one the venv was installed from.
ENV = {"COLUMNS": "200", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(ROOT)}


def pexec(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([PEXEC, *args], capture_output=True, text=True, timeout=300, env=ENV)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
@starts("ray")  # scored on Ray, as `pexec score` does by default
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    pexec("synth", "shop", "--rollouts", "800", "--tasks", "100", "--seed", "2", "--out", str(root / "store"))
    scored = pexec("score", str(root / "store"), "--out", str(root / "run"), "--num-cpus", "2")
    assert "plan: 1 file(s)" in scored.stderr and "scored 800" in scored.stderr
    return root / "run"


def test_score_metrics_and_sql_through_the_console_script(run):
    manifest = json.loads((run / "_manifest.json").read_text())
    assert manifest["counts"]["scored"] == 800 and manifest["settings"]["executor"] == "ray"
    lines = pexec("metrics", str(run), "--by", "model,method", "--bootstrap", "200", "--json").stdout.splitlines()
    cohorts = [json.loads(line) for line in lines]
    assert sorted((c["model"], c["method"]) for c in cohorts) == [
        ("model-a", "plan_execute"),
        ("model-a", "react"),
        ("model-b", "plan_execute"),
        ("model-b", "react"),
    ]
    assert sum(c["n"] for c in cohorts) == 800
    assert all(c["bootstrap"]["B"] == 200 and c["bootstrap"]["method"] == "multinomial" for c in cohorts)
    table = pexec("metrics", str(run), "--by", "model", "--bootstrap", "100").stdout
    assert "model-a" in table and "TER" in table and "B=100" in table
    csv = pexec("sql", str(run), "SELECT count(*) AS n FROM rollouts", "--format", "csv").stdout
    assert csv.split() == ["n", "800"] or csv.split() == ['"n"', "800"]
    # Each --by is kept under its own name: both results stay queryable.
    query = "SELECT (FROM metrics_by_model SELECT count(*)) a, (FROM metrics_by_model_and_method SELECT count(*)) b"
    joined = pexec("sql", str(run), query, "--format", "json").stdout
    assert json.loads(joined) == {"a": 2, "b": 4}


def test_writes_through_sql_are_refused(run):
    proc = pexec("sql", str(run), "DROP VIEW rollouts", ok=False)
    assert proc.returncode == 2 and "refused" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["score", "/nonexistent/store", "--out", "/tmp/x"], "no such store"),
        (["metrics", "/nonexistent/run"], "/nonexistent/run"),
        (["synth", "airline", "--out", "/tmp/x"], "'shop' spec, tau_telecom and tau_banking_knowledge only"),
        (["score", "/tmp", "--out", "/tmp/x", "--policy", "lenient"], "--policy is code or strict"),
    ],
)
def test_errors_are_one_clear_line(args, message):
    proc = pexec(*args, ok=False)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_bad_spec_is_reported_with_its_file_and_place(run, tmp_path):
    spec = tmp_path / "broken"
    shutil.copytree(ROOT / "specs" / "shop", spec)
    text = (spec / "spec.toml").read_text().replace('version = "1.0.0"', 'version = "1.0.0"\nextra = 1')
    (spec / "spec.toml").write_text(text)
    store = run.parent / "store"
    proc = pexec("score", str(store), "--out", str(tmp_path / "r"), "--env", str(spec), "--inline", ok=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(r"broken/spec\.toml: unknown field\(s\) extra", proc.stderr.replace("\n", ""))


def test_envs_lists_every_source_and_checks_each(tmp_path):
    shutil.copytree(ROOT / "specs" / "shop", tmp_path / "my_shop")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "spec.toml").write_text('name = "broken"\n')  # no version, no tools.json
    listed = pexec("envs", "--spec-dir", str(tmp_path)).stdout
    rows = {line.split("│")[1].strip(): line for line in listed.splitlines() if line.count("│") >= 3}
    assert {"bfcl_v3", "bfcl_v4", "tau_airline", "tau_retail", "toolsandbox", "observed", "shop"} <= set(rows)
    assert "built-in" in rows["bfcl_v3"] and str(tmp_path / "my_shop") in rows["my_shop"]
    checked = pexec("envs", "--spec-dir", str(tmp_path), "--check", ok=False)
    assert checked.returncode == 1
    lines = {line.split("│")[1].strip(): line for line in checked.stdout.splitlines() if line.count("│") >= 4}
    assert "bfcl-eval==2025.8.6.2+" in lines["bfcl_v3"] and "shop@1.0.0+" in lines["my_shop"]
    assert "cannot be built" in lines["broken"]


def test_records_of_an_environment_that_appears_later_are_rescored_on_rerun(tmp_path):
    # First run: the spec `late_shop` is not on the search path, so every record is rejected. Once it is
    # (as when a missing simulator gets installed), a rerun in a new process must rescore, not reuse.
    store, specs = tmp_path / "store", tmp_path / "specs"
    specs.mkdir()
    pexec("synth", "shop", "--rollouts", "60", "--tasks", "10", "--seed", "1", "--out", str(store))
    for path in store.glob("*.jsonl"):
        path.write_text(path.read_text().replace('"benchmark":"shop"', '"benchmark":"late_shop"'))
    env = {**ENV, "PEXEC_SPEC_PATH": str(specs)}

    def score() -> dict:
        proc = subprocess.run([PEXEC, "score", str(store), "--out", str(tmp_path / "run"), "--inline", "--allow-empty"],
                              capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads((tmp_path / "run" / "_manifest.json").read_text())

    first = score()
    assert first["counts"]["rejected"] == 60 and first["environments"] == {"late_shop": None}
    assert score()["counts"]["shards_reused"] == first["counts"]["shards"]  # still unknown: same output
    shutil.copytree(ROOT / "specs" / "shop", specs / "late_shop")
    third = score()
    assert third["counts"]["scored"] == 60 and third["counts"]["shards_reused"] == 0
    assert third["environments"]["late_shop"].startswith("shop@")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["synth", "airline", "--out", "{tmp}/s"],
            "synth knows how to build tasks for the 'shop' spec, tau_telecom and tau_banking_knowledge only",
        ),
        (["synth", "shop", "--rollouts", "5", "--out", "{tmp}/file/s"], "cannot write store {tmp}/file/s: [Errno"),
        (["ingest", "nope", "{tmp}", "--out", "{tmp}/s"], "unknown format 'nope'"),
        (["ingest", "canonical", "{tmp}", "--out", "{tmp}/s", "--label", "x"], "--label takes key=value, got 'x'"),
        (["ingest", "openai", "--out", "{tmp}/s"], "openai: give the files or folders to read"),
        (["ingest", "mlflow", "--out", "{tmp}/s", "--experiment", "x"], "mlflow: give the tracking server and the"),
        (["ingest", "openai", "{tmp}", "--out", "{tmp}/s", "--tracking-uri", "u"], "openai: unknown option(s)"),
        (["publish", "mlflow", "{tmp}/missing", "--tracking-uri", "http://127.0.0.1:9"], "no run at {tmp}/missing"),
        (["publish", "phoenix", "{tmp}", "--endpoint", "http://127.0.0.1:9"], "no scored run under {tmp}"),
        (["score", "{tmp}/missing", "--out", "{tmp}/r", "--inline"], "no such store: {tmp}/missing"),
        (["score", "{tmp}", "--out", "{tmp}/r", "--shard-mb", "0"], "--shard-mb takes a size > 0"),
        (["run", "{tmp}/missing.toml"], "{tmp}/missing.toml: [Errno 2]"),
        (["submit", str(ROOT / "jobs" / "demo.toml"), "--address", "ray://h:1"], "the Jobs API address is the Ray"),
        (["status", "id", "--address", "127.0.0.1:9"], "cannot get the status of id from http://127.0.0.1:9: Conn"),
        (["logs", "id", "--address", "auto"], "the Jobs API address is the Ray dashboard's http(s)://HOST:PORT"),
        (["stop", "id", "--address", "127.0.0.1:9"], "cannot reach the Jobs API at http://127.0.0.1:9: Connection"),
        (["jobs", "--address", "gcs://h:6379"], "the Jobs API address is the Ray dashboard's http(s)://HOST:PORT"),
        (["metrics", "{tmp}/missing"], "no run at {tmp}/missing"),
        (["metrics", "{tmp}"], "no scored run under {tmp}"),
        (["metrics", "{tmp}", "--method", "bayes"], "--method is multinomial or poisson"),
        (["report", "{tmp}", "--out", "{tmp}/r", "--k", "1,x"], "--k takes depths separated by commas"),
        (["report", "{tmp}", "--out", "{tmp}/r", "--compare", "a=1", "b=2"], "--compare must name the same column"),
        (["sql", "{tmp}/missing", "SELECT 1"], "no run at {tmp}/missing"),
        (["sql", "{tmp}", "SELEC 1"], 'Parser Error: syntax error at or near "SELEC" LINE 1: SELEC 1'),
        (
            ["bench", "nope"],
            "bench takes replay, metrics, merged, scale, view, guard, driver, distributed, bfcl, tau, nightly, "
            "nightly_otel, start, split, raw, spans or parts",
        ),
        (["guard", "serve", "--env", "nope"], "unknown environment 'nope'"),
        (["guard", "serve", "--env", "shop", "--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without a bearer"),
        (["guard", "serve", "--env", "shop", "--policy", "lax"], "--policy is code or strict"),
        (["guard", "mcp", "--spec", "nope", "--", "true"], "no spec named 'nope'"),
        (["guard", "mcp", "--", "{tmp}/no-server"], "upstream MCP server '{tmp}/no-server': "),
    ],
)
def test_a_pexec_error_from_any_command_is_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "file").write_text("a file where a folder is expected")
    result = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, result.exc_info
    [line] = result.stderr.strip().splitlines()  # score's progress bar leaves a blank line before it
    assert line.startswith("error: " + message.replace("{tmp}", str(tmp_path)))


def test_long_and_multi_line_messages_stay_one_line_and_verbatim(monkeypatch):
    message = "jobs/x.toml [report]: [/x] a message " + "long " * 60

    def fail(*args: object) -> None:
        raise PexecError(message.replace("a message", "a\nmessage"))

    monkeypatch.setattr(pipeline.metrics.run, "open_run", fail)
    result = CliRunner().invoke(app, ["sql", "run", "SELECT 1"])
    assert result.exit_code == 2
    assert result.stderr == f"error: {message.strip()}\n"  # rich markup is not interpreted


def test_any_other_exception_is_a_bug_and_keeps_its_traceback(monkeypatch):
    def bug(*args: object) -> None:
        raise KeyError("not a user error")

    monkeypatch.setattr(pipeline.metrics.run, "open_run", bug)
    result = CliRunner().invoke(app, ["sql", "run", "SELECT 1"])
    assert isinstance(result.exception, KeyError) and result.exit_code == 1
    assert "error:" not in result.output
    script = (
        "import pipeline.metrics.run as r; r.open_run = lambda *a: {}['boom']; from pipeline.apps.cli import app; app()"
    )
    proc = subprocess.run([sys.executable, "-c", script, "sql", "run", "SELECT 1"], capture_output=True, text=True,
                          timeout=120, env=ENV)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "KeyError" in proc.stderr
    assert "error:" not in proc.stderr


def test_a_reader_that_went_away_ends_the_command_quietly(monkeypatch):
    # `pexec sql … | head`: once head exits, a write fails with EPIPE; that is not a storage error to report.
    def gone(*args: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(pipeline.metrics.run, "open_run", gone)
    result = CliRunner().invoke(app, ["sql", "run", "SELECT 1"])
    assert result.exit_code == 1 and result.stderr == ""


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == version("pexec") + "\n"


def test_the_progress_counts_a_shard_scored_again_once_with_its_final_counts():
    # A shard holding a later copy of a duplicated id reports twice: first as if no id repeated, then with
    # the copy rejected. The bar ends at the number of shards and the counts are those of the final reports.
    from pipeline.core.run_folder import ShardMarker
    from pipeline.scoring.driver import ShardPlan

    def marker(shard: str, start: int, stop: int | None, **counts: int) -> ShardMarker:
        return ShardMarker(shard=shard, source="f", start=start, stop=stop, fingerprint="x", **counts)

    progress = pipeline.apps.cli._scoring.ScoreProgress()
    progress.on_plan(ShardPlan(files=1, shards=[object(), object()], ignored=[], total_bytes=0))  # type: ignore[list-item]
    progress.on_shard(marker("a", 0, 10, read=5, scored=5))
    progress.on_shard(marker("b", 10, None, read=3, scored=3))
    progress.on_shard(marker("a", 0, 10, read=5, scored=4, rejected=1))
    assert progress.bar.tasks[progress.task].completed == 2
    assert (progress.rollouts, progress.rejects) == (7, 1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed exception, on purpose
def test_a_signal_whose_exception_a_finaliser_swallowed_still_stops_the_job_at_the_next_shard(sig):
    # A signal that lands while a `__del__` runs raises there, and Python drops the exception ("Exception
    # ignored"): the job went on to score every shard and commit, exit 0. The next shard's progress stops it.
    from pipeline.apps.cli import _scoring
    from pipeline.core.run_folder import ShardMarker

    class Finalised:
        def __del__(self) -> None:
            signal.raise_signal(sig)
            sum(range(1000))  # the handler runs here, inside the finaliser

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        _scoring.unwind_on_sigterm()
        Finalised()  # collected at once: its exception goes to sys.unraisablehook, not here
        progress = _scoring.ScoreProgress()
        with pytest.raises(SystemExit if sig == signal.SIGTERM else KeyboardInterrupt) as stopped:
            progress.on_shard(ShardMarker(shard="a", source="f", start=0, stop=None, fingerprint="x"))
        if sig == signal.SIGTERM:
            assert stopped.value.code == 143
    finally:
        _scoring._SIGNALLED.clear()
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_every_reader_of_a_run_takes_the_shared_options_it_needs_and_no_other():
    import typer.main

    group = typer.main.get_command(app)
    cohorts = {"by", "harness_errors", "pool", "strict_replay"}
    intervals = {"bootstrap", "seed", "method"}
    storage = {"endpoint_url", "storage_option"}
    wanted = {
        "metrics": cohorts | intervals | storage | {"partial"},
        "report": cohorts | intervals | storage | {"partial"},
        "diff": cohorts | intervals | storage,
        "sql": storage | {"partial"},
        "view": intervals | storage | {"partial"},
    }
    shared = cohorts | intervals | storage | {"partial"}
    for name, options in wanted.items():
        taken = {p.name for p in group.commands[name].params}  # type: ignore[attr-defined]
        assert taken & shared == options, name
    # The readers that can compute in Ray tasks take the mergeable bootstrap (and --address); the viewer does not.
    for name in ("metrics", "report", "diff"):
        assert "poisson-merged" in CliRunner().invoke(app, [name, "--help"]).stdout, name
        assert "address" in {p.name for p in group.commands[name].params}, name  # type: ignore[attr-defined]
    assert "poisson-merged" not in CliRunner().invoke(app, ["view", "--help"]).stdout


def test_the_command_line_starts_without_what_only_some_commands_need():
    """Every `pexec` pays for what its start imports: the libraries only a few commands use (pandas, which
    building an Arrow array pulls in; Ray; plotting; the optional integrations) are imported by those commands."""
    later = ["pandas", "ray", "matplotlib", "inspect_ai", "opentelemetry", "mcp", "uvicorn", "s3fs", "hypothesis"]
    code = f"import sys, pipeline.apps.cli.app; print([m for m in {later!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True).stdout
    assert out.strip() == "[]", out
