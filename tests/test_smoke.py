"""One real log of each family, ingested and scored through the CLI in-process (`--inline`), against the verdicts
Python 3.11 gives: the check that another interpreter (`make smoke PYTHON=python3.13`) replays the official
simulators and the spec environments exactly alike. Each case's digest covers every step's verdict, check, cause
and output match, in order; the counts say what differs when it does not match."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from producers import pexec

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DATA = Path(__file__).parent / "data"

# name -> (format, source, ingest options, (rollouts, steps, invalid steps, output mismatches), digest)
CASES = {
    "bfcl_v4": (
        "bfcl", SHARED / "real" / "bfcl" / "gpt-oss-120b" / "BFCL_v4_multi_turn_base_result.json", [],
        (200, 1436, 137, 1), "c39efe3271f3705e",
    ),
    "bfcl_v3": ("bfcl", DATA / "bfcl" / "DeepSeek-V3-0324-FC", [], (1, 30, 9, 0), "71b3141c45d7d1ae"),
    "tau2": (
        "tau2", SHARED / "real" / "tau2" / "retail_gpt-4.1.json", ["--option", f"tasks={SHARED / 'tau3'}"],
        (40, 299, 15, 3), "f52c0bfacddc38fd",
    ),
    "toolsandbox": ("toolsandbox", min((DATA / "toolsandbox").iterdir()), [], (4, 11, 2, 0), "b5ecb554f07a874b"),
}  # fmt: skip


def verdict_digest(steps: list[dict]) -> str:
    ordered = sorted(steps, key=lambda s: (s["rollout_id"], s["step"]))
    text = "\n".join(
        f"{s['rollout_id']}|{s['step']}|{s['tool']}|{s['valid']}|{s['failed_check']}|{s['cause']}|{s['output_match']}"
        for s in ordered
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_real_log_scores_as_on_python_3_11(name: str, tmp_path: Path) -> None:
    fmt, source, options, counts, digest = CASES[name]
    if not source.exists():
        pytest.fail(f"{source} is missing (../shared/data must be beside the project)")
    pexec("ingest", fmt, str(source), "--out", "store", *options, cwd=tmp_path)
    pexec("score", "store", "--out", "run", "--inline", cwd=tmp_path)
    steps = pq.read_table(tmp_path / "run" / "steps").to_pylist()
    rollouts = pq.read_table(tmp_path / "run" / "rollouts").num_rows
    invalid = sum(not s["valid"] for s in steps)
    mismatched = sum(s["output_match"] is False for s in steps)
    assert (rollouts, len(steps), invalid, mismatched) == counts
    assert verdict_digest(steps) == digest
