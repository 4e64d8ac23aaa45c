"""pexec report: the paper's numbers, golden tables on a fixed synthetic run, the paired bootstrap
against an independent numpy implementation, ranking divergence, and the data behind each figure."""

from __future__ import annotations

import csv
import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_aggregate import draws, paper_rows, ratios, rollout, task_sums, weights, write_rollouts
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import Compare, ReportResult, build_report, parse_compare
from pipeline.report._ranking import kendall_tau_b, rank_conditions, ranks
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

GOLDEN = Path(__file__).with_name("golden")
SMALL = BootstrapSettings(B=200, seed=3)


def section(markdown: str, title: str) -> str:
    """The text of one `## title` section of report.md."""
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# --- the paper's worked example ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paper(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    run = tmp_path_factory.mktemp("paper-run")
    write_rollouts(run, paper_rows())
    return build_report(open_run(str(run)), run.parent / "paper-report", settings=SMALL, figures=False)


def test_paper_numbers_in_the_report(paper: ReportResult) -> None:
    md = (Path(paper.out) / "report.md").read_text()
    recovery = section(md, "Recovery arithmetic")
    # 200 episodes, all with a verdict; 10 executable & successful; 138 of the 190 with an invalid prefix
    # successful; 148 successes; the identity in those counts.
    identity = "148/200 = 10/200 · 10/10 + 190/200 · 138/190"
    assert f"| bench | 200 | 0 | 200 | 10 | 10 | 190 | 138 | 148 | 93.2% (138/148) | {identity} |" in recovery
    metrics = section(md, "Metrics per benchmark × condition")
    row = next(line for line in metrics.splitlines() if line.startswith("| bench |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["bench", "200", "50", "0", "0"]  # N, tasks, no verdict, harness errors
    assert cells[5].startswith("0.740 ")  # success
    assert cells[6].startswith("0.050 ")  # TER
    assert cells[11].startswith("0.726 ")  # RR = 138/190
    assert cells[12] == "190"  # RR eligible
    [r] = read_csv(Path(paper.out) / "tables" / "recovery.csv")
    assert float(r["share_successes_after_invalid_prefix"]) == 138 / 148
    [m] = pq.read_table(Path(paper.out) / "tables" / "metrics.parquet").to_pylist()
    assert (m["ter"], m["success"], m["rr"], m["rr_eligible"]) == (0.05, 0.74, 138 / 190, 190)
    html = (Path(paper.out) / "report.html").read_text()
    assert "93.2% (138/148)" in html and "0.726 [" in html


# --- golden tables on a fixed synthetic run ---------------------------------------------------------------


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    write_store(synthesize("shop", 600, 40, 11), str(root / "store"), "jsonl", 50_000, None)
    run_scoring(str(root / "store"), str(root / "run"), ScoreSettings(inline=True))
    return root / "run"


@pytest.fixture(scope="module")
def synth_report(synth_run: Path) -> ReportResult:
    compare = Compare("method", "react", "plan_execute")
    return build_report(
        open_run(str(synth_run)), synth_run.parent / "report", ["model", "method"], compare, [1, 3, 5], SMALL
    )


def test_golden_markdown(synth_report: ReportResult) -> None:
    md = (Path(synth_report.out) / "report.md").read_text()
    # The title names the (temporary) run folder; everything below it is fixed by the data, seed and B.
    body = md.split("\n", 1)[1]
    golden = GOLDEN / "report_synth.md"
    if os.environ.get("PEXEC_UPDATE_GOLDEN"):
        golden.write_text(body)
    assert body == golden.read_text()


def test_report_files(synth_report: ReportResult) -> None:
    files = [Path(p) for p in synth_report.files]
    names = {p.relative_to(synth_report.out).as_posix() for p in files}
    for table in ("metrics", "pec", "recovery", "causes", "fed", "tools", "costs", "ranking", "paired"):
        assert {f"tables/{table}.csv", f"tables/{table}.parquet"} <= names
    for fig in ("pec_curves", "fed_histogram", "first_causes", "tool_invalid_rates"):
        assert {f"figures/{fig}.png", f"figures/{fig}.svg", f"figures/{fig}.csv"} <= names
    assert {"report.md", "report.html"} <= names
    for p in files:
        assert p.stat().st_size > 0, p


def test_rerun_is_identical(synth_run: Path, synth_report: ReportResult, tmp_path: Path) -> None:
    again = build_report(
        open_run(str(synth_run)),
        tmp_path,
        ["model", "method"],
        Compare("method", "react", "plan_execute"),
        [1, 3, 5],
        SMALL,
    )
    for p in map(Path, synth_report.files):
        rel = p.relative_to(synth_report.out)
        if p.suffix != ".parquet":  # Parquet files embed the writer's metadata; their numbers are tested elsewhere
            assert (Path(again.out) / rel).read_bytes() == p.read_bytes(), rel


def test_recovery_identity_and_causes(synth_report: ReportResult) -> None:
    t = synth_report.tables
    for r in t.recovery:
        assert r["n_executable_success"] + r["n_invalid_prefix_success"] == r["n_success"]
    for c, r in zip(t.cohorts, t.recovery, strict=True):
        assert (c["model"], c["method"]) == (r["model"], r["method"])
        assert c["rr"]["eligible"] == r["n_invalid_prefix_with_verdict"] <= r["n_invalid_prefix"]
        assert math.isclose(c["rr"]["value"], r["n_invalid_prefix_success"] / c["rr"]["eligible"])
        causes = [x for x in t.causes if (x["model"], x["method"]) == (r["model"], r["method"])]
        assert sum(x["n"] for x in causes) == r["n_invalid_prefix"]
    assert {x["cost"] for x in t.costs} == {"cost_tokens", "cost_latency_s"}


# --- paired comparison -----------------------------------------------------------------------------------


def test_paired_matches_numpy(synth_run: Path, synth_report: ReportResult) -> None:
    """The SQL paired bootstrap equals a direct numpy one with the same draws over the shared tasks."""
    rows = pq.read_table(synth_run / "rollouts").to_pylist()
    for model in ("model-a", "model-b"):
        got = {r["metric"]: r for r in synth_report.paired if r["model"] == model}
        side = {m: [r for r in rows if r["model"] == model and r["method"] == m] for m in ("react", "plan_execute")}
        tasks = sorted(set(r["task_id"] for r in side["react"]) & set(r["task_id"] for r in side["plan_execute"]))
        d = draws(SMALL.seed, SMALL.B, len(tasks)) % np.uint64(len(tasks))  # [B, m] drawn task numbers
        counts = np.stack([np.bincount(row, minlength=len(tasks)) for row in d])

        def per_task(rs: list[dict], tasks: list[str], num: Any, den: Any) -> tuple[np.ndarray, np.ndarray]:
            by_task = {t: [r for r in rs if r["task_id"] == t] for t in tasks}
            return (
                np.array([sum(num(r) for r in by_task[t]) for t in tasks], float),
                np.array([sum(den(r) for r in by_task[t]) for t in tasks], float),
            )

        for metric, num, den in [
            ("ter", lambda r: r["executable"], lambda r: 1),
            ("success", lambda r: r["success"], lambda r: 1),
            ("rr", lambda r: not r["executable"] and r["success"], lambda r: not r["executable"]),
            ("pec@3", lambda r: min(r["T"], r["fed"] - 1) >= 3, lambda r: 1),
        ]:
            na, da = per_task(side["react"], tasks, num, den)
            nb, db_ = per_task(side["plan_execute"], tasks, num, den)
            diff = counts @ na / (counts @ da) - counts @ nb / (counts @ db_)
            assert math.isclose(got[metric]["value"], na.sum() / da.sum() - nb.sum() / db_.sum(), abs_tol=1e-12)
            assert math.isclose(got[metric]["lo"], float(np.quantile(diff, 0.025)), abs_tol=1e-12), metric
            assert math.isclose(got[metric]["hi"], float(np.quantile(diff, 0.975)), abs_tol=1e-12), metric
            assert got[metric]["shared_tasks"] == len(tasks)
        tok = {m: np.mean([r["cost_tokens"] for r in side[m] if r["task_id"] in tasks]) for m in side}
        assert math.isclose(got["cost_tokens"]["value"], 100 * (tok["react"] / tok["plan_execute"] - 1), rel_tol=1e-9)


def test_paired_uses_shared_tasks_only(tmp_path: Path) -> None:
    rows = [rollout("t1", 2, 3, True, method="a"), rollout("t2", 2, 1, False, method="a")]
    rows += [rollout("t1", 2, 1, True, method="b"), rollout("t3", 2, 3, True, method="b")]
    write_rollouts(tmp_path / "run", rows)
    r = build_report(
        open_run(str(tmp_path / "run")), tmp_path / "out", None, Compare("method", "a", "b"), [1], SMALL, figures=False
    )
    ter = next(x for x in r.paired if x["metric"] == "ter")
    # Only t1 is shared: A executable (1.0), B not (0.0).
    assert (ter["shared_tasks"], ter["value_a"], ter["value_b"], ter["value"]) == (1, 1.0, 0.0, 1.0)
    # Its bootstrap always redraws t1: a zero-width interval that says nothing. Below 30 tasks there is none.
    assert (ter["den_tasks"], ter["den_total"], ter["small_sample"], ter["lo"], ter["hi"]) == (1, 1, True, None, None)
    costs = next(x for x in r.paired if x["metric"] == "cost_tokens")
    assert costs["value"] == 0.0  # both sides cost 100 tokens per rollout


def test_empty_pairing_is_said(tmp_path: Path) -> None:
    rows = [rollout("t1", 2, 3, True, method="a"), rollout("t2", 2, 1, False, method="b")]
    write_rollouts(tmp_path / "run", rows)
    r = build_report(
        open_run(str(tmp_path / "run")), tmp_path / "out", None, Compare("method", "a", "b"), [1], SMALL, figures=False
    )
    assert r.paired == []
    assert "The pairing is empty" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["method=a"], "exactly two"),
        (["method=a", "model=b"], "same column"),
        (["method=a", "method=a"], "two different"),
        (["method", "method=b"], "COL=VALUE"),
    ],
)
def test_parse_compare_errors(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_compare(items)


# --- ranking ---------------------------------------------------------------------------------------------


def test_ranks_and_tau_b() -> None:
    assert ranks([0.5, 0.9, 0.5, None]) == [2.5, 1.0, 2.5, 4.0]
    assert kendall_tau_b([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    # With ties, τ-b = (C - D) / sqrt((C + D + Tx)(C + D + Ty)): x = [1, 2, 2, 3], y = [1, 3, 2, 4]:
    # pairs: C = 5, D = 0, tied only in x = 1, only in y = 0 -> 5 / sqrt(6 * 5).
    assert math.isclose(kendall_tau_b([1, 2, 2, 3], [1, 3, 2, 4]), 5 / math.sqrt(30))


def test_flips_flagged() -> None:
    r = rank_conditions(
        "b",
        ["p", "q", "r"],
        {"success": [0.9, 0.8, 0.7], "ter": [0.1, 0.5, 0.3], "auc_pec": [0.9, 0.8, 0.7]},
    )
    assert r.ranks["ter"] == [3.0, 1.0, 2.0]
    assert r.tau["auc_pec"] == 1.0 and math.isclose(r.tau["ter"], -1 / 3)
    assert {(f.metric, f.higher_success, f.higher_metric) for f in r.flips} == {("ter", "p", "q"), ("ter", "p", "r")}


def test_ranking_in_report(synth_report: ReportResult) -> None:
    [ranking] = synth_report.rankings
    assert ranking.group == {"benchmark": "shop"} and len(ranking.conditions) == 4
    md = (Path(synth_report.out) / "report.md").read_text()
    text = section(md, "Ranking divergence — shop")
    assert f"Kendall τ-b (success vs TER): {ranking.tau['ter']:.3f}" in text


# --- figures: the data they draw -------------------------------------------------------------------------


def test_figure_data(synth_report: ReportResult) -> None:
    charts = {c.name: c for c in synth_report.charts}
    t = synth_report.tables
    pec = read_csv(Path(synth_report.out) / "figures" / "pec_curves.csv")
    for c in t.cohorts:
        label = f"{c['model']} · {c['method']}"
        curve = [p for p in pec if p["condition"] == label]
        assert [int(p["k"]) for p in curve] == [p["k"] for p in c["pec"]] == list(range(len(curve)))
        assert [float(p["pec"]) for p in curve] == [p["value"] for p in c["pec"]]
        assert all(float(p["lo"]) <= float(p["pec"]) <= float(p["hi"]) for p in curve)
        fed = [r for r in charts["fed_histogram"].rows if r[1] == label]
        assert math.isclose(sum(r[4] for r in fed), 1.0)
        assert next(r for r in fed if r[2] == "executable")[4] == c["ter"]["value"]
        causes = [r for r in charts["first_causes"].rows if r[1] == label]
        assert math.isclose(sum(r[4] for r in causes), 1.0)
        assert [r[2] for r in causes] == [x for x in ("schema", "dependency", "information", "state_consistency",
                                                       "precondition") if x in {r[2] for r in causes}]  # fmt: skip
    for c in charts.values():
        assert c.png.startswith(b"\x89PNG") and "<svg" in c.svg


# --- command line ----------------------------------------------------------------------------------------


def test_cli_report(synth_run: Path, tmp_path: Path) -> None:
    args = ["report", str(synth_run), "--out", str(tmp_path / "r"), "--by", "method", "--k", "2,4"]
    args += ["--compare", "method=react", "method=plan_execute", "--bootstrap", "50", "--seed", "1", "--no-figures"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert "PEC@2" in md and "PEC@4" in md and "B=50, seed=1" in md
    assert "Paired comparison — method: react − plan\\_execute" in md


def test_no_figures_writes_the_same_tables_and_text_says_so_and_draws_nothing(
    synth_run: Path, synth_report: ReportResult, tmp_path: Path
) -> None:
    args = ["report", str(synth_run), "--out", str(tmp_path / "r"), "--by", "model,method", "--k", "1,3,5"]
    args += ["--compare", "method=react", "method=plan_execute", "--bootstrap", "200", "--seed", "3", "--no-figures"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    drawn, bare = Path(synth_report.out), tmp_path / "r"
    assert not (bare / "figures").exists() and (drawn / "figures" / "pec_curves.pdf").exists()
    assert sorted(p.name for p in (bare / "tables").iterdir()) == sorted(p.name for p in (drawn / "tables").iterdir())
    for table in (drawn / "tables").glob("*.csv"):
        assert (bare / "tables" / table.name).read_bytes() == table.read_bytes(), table.name
    md, full = (bare / "report.md").read_text(), (drawn / "report.md").read_text()
    assert "Figures not drawn (asked for the tables alone: --no-figures)." in md and "## Figures" not in md
    assert md.split("\n## ", 1)[1] == full.split("\n## ", 1)[1].split("\n## Figures", 1)[0].rstrip() + "\n"
    assert "Figures not drawn" in (bare / "report.html").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--compare", "method=react", "method=nope"],
            "no rollouts with method='nope' (values present: 'plan_execute', 'react')",
        ),
        (["--compare", "foo=a", "foo=b"], "unknown cohort column 'foo'"),
        (["--k", "0"], "--k takes depths >= 1"),
        (["--by", "nope"], "unknown cohort column 'nope'"),
    ],
)
def test_cli_errors(synth_run: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["report", str(synth_run), "--out", str(tmp_path), "--bootstrap", "5", *extra])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_labels_are_escaped(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>|*x*"
    rows = [rollout("t1", 2, 3, True, model=evil), rollout("t1", 2, 1, False, model="plain")]
    write_rollouts(tmp_path / "run", rows)
    r = build_report(open_run(str(tmp_path / "run")), tmp_path / "out", settings=BootstrapSettings(B=5), figures=False)
    html = (Path(r.out) / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;|*x*" in html
    md = (Path(r.out) / "report.md").read_text()
    assert "\\<script\\>alert(1)\\</script\\>\\|\\*x\\*" in md


# --- unknown verdicts: one population for success, RR and P(success | executable) ------------------------


def test_unknown_verdicts_identity_and_counts_agree(tmp_path: Path) -> None:
    """8 rollouts, one without a verdict (invalid prefix). success = 5/7 = 0.7143; with the TER over all 8 the
    identity would give 0.5 · 3/4 + 0.5 · 2/3 = 0.7083, so it is stated over the 7 with a verdict (TER_v = 4/7),
    and the recovery table's RR denominator is 3, as the metrics table's RR n (not 4)."""
    rows = [rollout(f"t{i}", 2, 3, True) for i in range(3)]  # executable & successful
    rows += [rollout("t3", 2, 3, False)]  # executable, failed
    rows += [rollout(f"t{4 + i}", 2, 1, True) for i in range(2)]  # invalid prefix, successful (recovered)
    rows += [rollout("t6", 2, 2, False), rollout("t7", 2, 1, None)]  # invalid prefix: failed; no verdict
    write_rollouts(tmp_path / "run", rows)
    report = build_report(open_run(str(tmp_path / "run")), tmp_path / "out", settings=SMALL, figures=False)
    [c] = report.tables.cohorts
    [r] = report.tables.recovery
    assert c["n_unknown_success"] == r["n_unknown_success"] == 1
    assert c["success"]["value"] == 5 / 7 and c["ter"]["value"] == 4 / 8
    assert c["rr"]["eligible"] == r["n_invalid_prefix_with_verdict"] == 3 and c["rr"]["value"] == 2 / 3
    p_exec = c["success_given_executable"]
    assert p_exec["eligible"] == r["n_executable_with_verdict"] == 4 and p_exec["value"] == 3 / 4
    # The identity, exactly, in the metrics' own counts: TER_v = 4 / (4 + 3).
    known = p_exec["eligible"] + c["rr"]["eligible"]
    assert known == r["n_with_verdict"] == c["n"] - c["n_unknown_success"]
    ter_v = Fraction(p_exec["eligible"], known)
    success = Fraction(r["n_success"], known)
    assert success == ter_v * Fraction(r["n_executable_success"], 4) + (1 - ter_v) * Fraction(2, 3)
    assert float(success) == c["success"]["value"]
    assert ter_v * Fraction(3, 4) + (1 - ter_v) * Fraction(2, 3) == Fraction(5, 7)
    assert Fraction(1, 2) * Fraction(3, 4) + Fraction(1, 2) * Fraction(2, 3) != Fraction(5, 7)  # TER over all N
    md = (Path(report.out) / "report.md").read_text()
    recovery = section(md, "Recovery arithmetic")
    assert "| bench | 8 | 1 | 7 | 4 | 3 | 3 | 2 | 5 | 40.0% (2/5) | 5/7 = 4/7 · 3/4 + 3/7 · 2/3 |" in recovery
    metrics = section(md, "Metrics per benchmark × condition")
    cells = [x.strip() for x in next(ln for ln in metrics.splitlines() if ln.startswith("| bench |")).split("|")[1:-1]]
    assert cells[3:5] == ["1", "0"]  # no verdict, harness errors
    assert cells[5].startswith("0.714 ") and cells[11].startswith("0.667 ") and cells[12] == "3"
    [m] = pq.read_table(Path(report.out) / "tables" / "metrics.parquet").to_pylist()
    assert (m["n_unknown_success"], m["rr_eligible"], m["success_given_executable_eligible"]) == (1, 3, 4)


# --- ranking within a column, with the share of replicates in which a flip holds -------------------------


def test_ranking_within_model_and_flip_share_matches_numpy(synth_run: Path, tmp_path: Path) -> None:
    """`--within model`: per model the methods are ranked. model-b's methods flip (react: more successes, lower
    TER); the share of replicates in which that holds is recomputed with the same draws in numpy."""
    report = build_report(
        open_run(str(synth_run)), tmp_path, ["model", "method"], settings=SMALL, within="model", figures=False
    )
    assert [r.group for r in report.rankings] == [
        {"benchmark": "shop", "model": "model-a"},
        {"benchmark": "shop", "model": "model-b"},
    ]
    assert all(r.conditions == ["plan_execute", "react"] for r in report.rankings)
    assert report.rankings[0].flips == []
    flips = {f.metric: f for f in report.rankings[1].flips}
    assert set(flips) == {"ter", "auc_pec"}
    assert all((f.higher_success, f.higher_metric) == ("react", "plan_execute") for f in flips.values())

    rows = pq.read_table(synth_run / "rollouts").to_pylist()
    reps = {}
    for method in ("plan_execute", "react"):
        cohort = [r for r in rows if (r["model"], r["method"]) == ("model-b", method)]
        S = task_sums(cohort, 0)
        W = weights(SMALL.seed, SMALL.B, len(S["n"]), SMALL.method)
        reps[method] = ratios({k: W @ v for k, v in S.items()})
    for metric, f in flips.items():
        holds = (reps["react"]["success"] > reps["plan_execute"]["success"]) & (
            reps["plan_execute"][metric] > reps["react"][metric]
        )
        assert f.share == pytest.approx(holds.mean(), abs=1e-12) and 0.5 < f.share <= 1
    md = (Path(report.out) / "report.md").read_text()
    text = section(md, "Ranking divergence — shop · model=model-b")
    assert f"(holds in {100 * flips['ter'].share:.0f}% of replicates)" in text
    ranking = pq.read_table(Path(report.out) / "tables" / "ranking.parquet").to_pylist()
    assert {r["model"] for r in ranking} == {"model-a", "model-b"}
    assert "of replicates" in next(r["flips"] for r in ranking if r["model"] == "model-b")


def test_within_must_be_a_cohort_column(synth_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--within takes one of the cohort's label columns"):
        build_report(open_run(str(synth_run)), tmp_path, ["method"], settings=BootstrapSettings(B=5), within="model")


def test_flip_share_counts_replicates() -> None:
    # p above q under success in replicates 0, 1, 2; q above p under TER in 0, 2, 3; replicate 4 undefined.
    replicates = {
        "success": [np.array([0.9, 0.8, 0.7, 0.1, np.nan]), np.array([0.5, 0.5, 0.5, 0.5, 0.5])],
        "ter": [np.array([0.1, 0.9, 0.1, 0.1, 0.1]), np.array([0.2, 0.2, 0.2, 0.2, 0.2])],
    }
    r = rank_conditions({"benchmark": "b"}, ["p", "q"], {"success": [0.9, 0.5], "ter": [0.1, 0.2]}, replicates)
    [flip] = r.flips
    assert (flip.higher_success, flip.higher_metric) == ("p", "q")
    assert flip.share == 2 / 4  # replicates 0 and 2 of the 4 defined ones


@given(st.lists(st.text("abc", min_size=1, max_size=3), unique=True, max_size=40))
def test_a_list_of_values_in_a_message_shows_ten_and_counts_the_rest(values: list[str]) -> None:
    from pipeline.core.text import some

    said = some(values, 10)
    shown = said.split(" and ")[0].split(", ") if values else []
    assert shown == values[:10]
    assert said.endswith(f" and {len(values) - 10} more") == (len(values) > 10)


def test_a_paired_comparison_with_the_merged_bootstrap_is_refused_before_any_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--compare draws multinomial or Poisson replicates only: with poisson-merged (the method that runs on Ray) the
    report is refused in one line before its metrics are computed, which on a night's run takes minutes."""
    from pipeline.core.errors import ReportError
    from pipeline.report import _build

    rows = [rollout("t1", 2, 3, True, method="a"), rollout("t1", 2, 1, False, method="b")]
    write_rollouts(tmp_path / "run", rows)

    def no_metrics(*_: object, **__: object) -> None:
        raise AssertionError("the metrics were computed")

    monkeypatch.setattr(_build, "run_tables", no_metrics)
    compare = parse_compare(("method=a", "method=b"))
    merged = BootstrapSettings(method="poisson-merged")
    with pytest.raises(ReportError, match="multinomial or poisson, not poisson-merged"):
        build_report(open_run(str(tmp_path / "run")), tmp_path / "out", ["method"], compare, settings=merged)
