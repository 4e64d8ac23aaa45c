"""Human output fits the width it is given (COLUMNS; PIPED_WIDTH on a pipe without it): metrics in the columns a
reader needs first (the rest with --columns), one cohort per block when even those do not fit; diff's drift per
cohort; sql one record per block when wider (said on stderr) or with --vertical. The machine formats do not
depend on the width."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.cli._render import DEFAULT_COLUMNS, PIPED_WIDTH, metrics_columns
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two runs with the demo's labels (model, method) and different tasks, as `make demo` writes one."""
    root = tmp_path_factory.mktemp("width")
    for seed in (0, 1):
        write_store(synthesize("shop", 400, 25, seed), str(root / f"store{seed}"), "jsonl", 50_000, None)
        run_scoring(str(root / f"store{seed}"), str(root / f"run{seed}"), ScoreSettings(inline=True))
    return str(root / "run0"), str(root / "run1")


def shown(width: int | None, *args: str) -> tuple[str, str]:
    env = {"COLUMNS": str(width)} if width else {"COLUMNS": ""}
    result = CliRunner(env=env).invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


COMMANDS = [
    ["metrics", "{a}", "--by", "model,method", "--bootstrap", "50"],
    ["metrics", "{a}", "--by", "model,method", "--bootstrap", "50", "--columns", "all"],
    ["diff", "{a}", "{b}", "--unpaired", "--by", "model,method", "--bootstrap", "20"],
    ["diff", "{a}", "{a}", "--bootstrap", "20"],
    ["sql", "{a}", "SELECT * FROM rollouts ORDER BY rollout_id LIMIT 3"],
    ["sql", "{a}", "SELECT 'a' || repeat(' said', 60) AS detail, repeat('x', 300) AS token"],
]


@pytest.mark.parametrize("width", [120, 80])
@pytest.mark.parametrize("command", COMMANDS, ids=["metrics", "metrics-all", "drift", "paired", "sql", "sql-long"])
def test_no_line_is_wider_than_the_width_given(runs, width: int, command: list[str]) -> None:
    a, b = runs
    stdout, stderr = shown(width, *(x.format(a=a, b=b) for x in command))
    assert stdout and widest(stdout) <= width and widest(stderr) <= width


def test_piped_output_without_columns_fits_the_documented_width(runs) -> None:
    stdout, _ = shown(None, "metrics", runs[0], "--by", "model,method", "--bootstrap", "50", "--columns", "all")
    assert PIPED_WIDTH == 120 and 80 < widest(stdout) <= PIPED_WIDTH


def test_metrics_show_the_default_columns_as_a_table_at_120_and_one_cohort_per_block_at_80(runs) -> None:
    a = runs[0]
    wide, _ = shown(120, "metrics", a, "--by", "model,method", "--bootstrap", "50")
    headers = {c.key: c.header for c in metrics_columns()}
    head = next(line for line in wide.splitlines() if "benchmark" in line)
    assert [h for h in head.replace("┃", "|").split("|") if h.strip()] and all(
        headers[k] in head for k in DEFAULT_COLUMNS if k not in ("benchmark", "condition")
    )
    assert "harness errors" not in head and "-[ " not in wide
    narrow, _ = shown(80, "metrics", a, "--by", "model,method", "--bootstrap", "50")
    cohorts = [json.loads(line) for line in shown(80, "metrics", a, "--by", "model,method", "--bootstrap", "50",
                                                   "--json")[0].splitlines()]  # fmt: skip
    for c in cohorts:
        assert f"-[ shop · {c['model']} · {c['method']} ]-" in narrow
        ter = c["ter"]
        line = rf"TER +\| {ter['value']:.3f}( †)? \[{ter['lo']:.3f}–{ter['hi']:.3f}\]\n"
        assert re.search(line, narrow), line


def test_an_unknown_column_is_refused_naming_the_keys(runs) -> None:
    result = CliRunner().invoke(app, ["metrics", runs[0], "--columns", "ter,nope"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --columns takes `all` or keys separated by commas, got 'ter,nope' (keys: ")


def test_machine_formats_do_not_depend_on_the_width(runs) -> None:
    a = runs[0]
    for args in (["metrics", a, "--bootstrap", "50", "--json"], ["sql", a, "SELECT * FROM rollouts", "--format", "csv"],
                 ["sql", a, "SELECT * FROM steps LIMIT 50", "--format", "json"]):  # fmt: skip
        assert shown(40, *args)[0] == shown(300, *args)[0]


def test_sql_goes_vertical_when_wider_saying_so_and_on_request(runs) -> None:
    a = runs[0]
    stdout, stderr = shown(120, "sql", a, "SELECT * FROM rollouts ORDER BY rollout_id LIMIT 2")
    assert stdout.count("-[ RECORD ") == 2 and "one record per block" in stderr
    small, note = shown(120, "sql", a, "SELECT count(*) AS n FROM rollouts")
    assert "┃ n" in small and note == ""
    vertical, note = shown(120, "sql", a, "SELECT count(*) AS n FROM rollouts", "--vertical")
    assert vertical.splitlines()[1:] == ["n | 400"] and note == ""


def test_a_long_value_goes_on_under_itself_whole(runs) -> None:
    value = "the environment said: " + " ".join(f"word{i}" for i in range(60))
    stdout, _ = shown(80, "sql", runs[0], f"SELECT 1 AS n, '{value}' AS detail", "--vertical")
    lines = stdout.splitlines()[1:]
    assert lines[0] == "n      | 1" and all(line.startswith(("detail | ", "       | ")) for line in lines[1:])
    assert " ".join(line[9:] for line in lines[1:]) == value and widest(stdout) <= 80
