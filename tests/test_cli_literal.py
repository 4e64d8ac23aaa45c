"""Data is never markup: strings from the logs, paths and exceptions print as they are.

A run whose labels, arguments, step details and path carry Rich markup (`[/x]`, `[bold]`), an `:emoji:` code,
ANSI escapes and control characters goes through `pexec score`, `metrics`, `sql`, `report` and `envs`:
every command succeeds, the text appears literally and control characters appear as escapes, never raw.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.cli._render import literal
from pipeline.synthetic.rollouts import synthesize

MARKUP = "[/x][bold]b:smile:"
CONTROL = "\x1b[31mred\x1b[0m\r\x07\u202e"
SHOWN = "\\x1b[31mred\\x1b[0m\\r\\x07\\u202e"  # how CONTROL must appear

pytestmark = pytest.mark.fuzz  # an adversarial suite: `make fuzz` runs it too


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output  # no raw control characters
    return result.output


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Brackets in a run's own path break its globs (storage, DuckDB): that is not printing, so the run
    # folder carries only the emoji code; output paths below carry the brackets.
    root = tmp_path_factory.mktemp("lit") / "dir:smile:"
    store = root / "store"
    store.mkdir(parents=True)
    lines = []
    for i, record in enumerate(synthesize("shop", 40, 10, 1)):
        record["labels"] = {"model": MARKUP if i % 2 else CONTROL, "method": "[red]m[/red]"}
        if i % 5 == 0:  # an invented order id: its detail quotes the argument
            record["events"].append({"type": "call", "tool": "get_order", "arguments": {"order_id": MARKUP + CONTROL}})
        lines.append(json.dumps(record))
    (store / "part.jsonl").write_text("\n".join(lines) + "\n")
    scored = cli("score", str(store), "--out", str(root / "run"), "--inline")
    assert "dir:smile:/run" in scored and "scored 40" in scored
    return root / "run"


def test_score_prints_paths_literally(run: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / f"run{MARKUP}"
    scored = cli("score", str(run.parent / "store"), "--out", str(out_dir), "--inline").replace("\n", "")
    assert f"-> {out_dir}" in scored


def test_metrics_table_prints_labels_literally(run: Path) -> None:
    table = cli("metrics", str(run), "--bootstrap", "50")
    assert f"[red]m[/red] · {MARKUP}" in table  # condition = method · model
    assert SHOWN in table  # the other model, its cell wrapped after "[red]m[/red] ·"
    assert "dir:smile:/run/metrics/" in table.replace("\n", "")


def test_sql_table_prints_values_and_column_names_literally(run: Path) -> None:
    query = (
        'SELECT DISTINCT model AS "[/x]", detail FROM steps '
        "WHERE tool = 'get_order' AND detail LIKE '%occurs in no%' ORDER BY 1"
    )
    table = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["sql", str(run), query]).stdout  # wide enough
    assert "[/x]" in table.splitlines()[1]
    assert MARKUP in table and SHOWN in table
    records = cli("sql", str(run), query, "--vertical")  # one record per block: names and values literal too
    assert records.splitlines()[1].startswith("[/x]") and MARKUP in records and SHOWN in records


def test_sql_csv_writes_control_characters_as_escapes_and_json_keeps_them_exactly(run: Path) -> None:
    """A raw carriage return ends a CSV record for most readers, and an escape sequence reaches the terminal."""
    query = "SELECT DISTINCT model FROM rollouts ORDER BY 1"
    rows = list(csv.reader(io.StringIO(cli("sql", str(run), query, "--format", "csv"))))
    assert rows == [["model"], [SHOWN], [MARKUP]]  # ordered by the values themselves
    exact = CliRunner().invoke(app, ["sql", str(run), query, "--format", "json"]).stdout
    assert [json.loads(line)["model"] for line in exact.splitlines()] == [CONTROL, MARKUP]


def test_score_error_with_markup_is_one_literal_line(tmp_path: Path) -> None:
    output = cli("score", f"nope{MARKUP}", "--out", str(tmp_path / "r"), "--inline", code=2)
    assert output.strip() == f"error: no such store: nope{MARKUP}"


def test_report_prints_paths_literally(run: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / f"rep{MARKUP}"
    output = cli("report", str(run), "--out", str(out_dir), "--bootstrap", "50")
    assert f"rep{MARKUP}/report.html" in output.replace("\n", "")


def test_report_says_where_it_is_and_lists_its_files_on_request(run: Path, tmp_path: Path) -> None:
    short = cli("report", str(run), "--out", str(tmp_path / "a"), "--bootstrap", "50")
    files = sorted(str(p) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) > 20
    assert short.count(str(tmp_path)) == 2, short  # where the report is and its main files, not every path
    assert f"({len(files)} files; --list names them)" in short.replace("\n", "")
    assert "fed_histogram.png" not in short
    listed = cli("report", str(run), "--out", str(tmp_path / "b"), "--bootstrap", "50", "--list")
    shown = set(listed.splitlines())
    assert {f.replace(str(tmp_path / "a"), str(tmp_path / "b")) for f in files} <= shown


def test_envs_prints_names_paths_and_failures_literally(tmp_path: Path) -> None:
    name = "bad[bold]b:smile:[red]"  # a folder name cannot hold the '/' of [/x]
    (tmp_path / name).mkdir()
    (tmp_path / name / "spec.toml").write_text('name = "[/x]"\n')  # no version, no tools.json
    output = cli("envs", "--spec-dir", str(tmp_path), "--check", code=1)
    row = next(line for line in output.splitlines() if name in line)
    assert row.split("│")[1].strip() == name and "cannot be built" in row


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("[/x]", "[/x]"),
        ("a\nb\tc", "a\\nb\\tc"),
        ("\x9b2J", "\\x9b2J"),
        ("\u2066x\u2069", "\\u2066x\\u2069"),
        ("é😀", "é😀"),
    ],
)
def test_literal_escapes_control_characters_only(value: str, shown: str) -> None:
    assert literal(value) == shown
