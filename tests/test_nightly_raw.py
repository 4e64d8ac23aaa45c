"""One nightly job from raw logs to the alert, on a real S3-compatible server (moto): `format = "openai"` over
`s3://…/date={date}/` scores the night's logs where they lie, then metrics, the report and the diff against
the previous night with `fail_on`. Nights 1 and 2 pass; night 3 carries a regression and exits 1 with a
`breach` line; a file arriving late for night 3 is all its rerun scores (the first file's shard is reused)."""

from __future__ import annotations

import json

import orjson
from conftest import s3_filesystem
from typer.testing import CliRunner

from pipeline.apps.cli.app import app
from pipeline.synthetic.support_logs import write_samples

NIGHTS = ("2026-11-27", "2026-11-28", "2026-11-29")
BUCKET = "pexec-test/nightly-raw"


def regressed(lines: list[bytes]) -> list[bytes]:
    """The night's conversations with the first call of each made unparseable: what a broken agent release logs."""
    out = []
    for line in lines:
        record = orjson.loads(line)
        for message in record["messages"]:
            if message.get("tool_calls"):
                message["tool_calls"][0]["function"]["arguments"] = '{"order_id": '
                break
        out.append(orjson.dumps(record) + b"\n")
    return out


def test_three_nights_from_raw_logs_to_the_alert(tmp_path, s3, shared_ray):
    [night] = write_samples(tmp_path / "logs", NIGHTS[:1], per_date=16, seed=5)
    [late] = write_samples(tmp_path / "late", ("2026-11-30",), per_date=4, seed=6)  # other ids: another day's
    lines = night.read_bytes().splitlines(keepends=True)
    fs = s3_filesystem(s3)
    for day, content in zip(NIGHTS, (lines, lines, regressed(lines)), strict=True):
        fs.pipe(f"{BUCKET}/logs/date={day}/conversations.jsonl", b"".join(content))
    job = tmp_path / "nightly.toml"
    job.write_text(
        f"""name = "nightly_raw"
input = "s3://{BUCKET}/logs/date={{date}}/"
format = "openai"
output = "s3://{BUCKET}/runs/date={{date}}"
endpoint_url = "{s3["endpoint_url"]}"
env = "observed"
spec = "support"
options = {{ error_prefix = "Error:" }}

[metrics]
by = ["model"]
bootstrap = 100

[report]
overwrite = true

[diff]
fail_on = ["ter<-0.05"]
"""
    )
    runner = CliRunner()

    def run(day: str) -> tuple[int, str, dict]:
        result = runner.invoke(app, ["run", str(job), "--date", day])
        manifest = json.loads(fs.cat(f"{BUCKET}/runs/date={day}/_manifest.json"))
        return result.exit_code, result.output, manifest

    code, output, manifest = run(NIGHTS[0])
    assert code == 0, output
    assert "diff skipped" in output and manifest["input"]["format"] == "openai"
    assert manifest["counts"]["scored"] == 16 and manifest["settings"]["executor"] == "ray"
    assert fs.exists(f"{BUCKET}/runs/date={NIGHTS[0]}/report/report.md")

    code, output, _ = run(NIGHTS[1])
    assert code == 0, output
    assert f"runs/date={NIGHTS[0]} (A)" in output and "breach" not in output

    code, output, manifest = run(NIGHTS[2])
    assert code == 1, output
    assert any(line.startswith("breach ter<-0.05") for line in output.splitlines()), output
    assert manifest["counts"]["shards_reused"] == 0

    fs.put(str(late), f"{BUCKET}/logs/date={NIGHTS[2]}/late.jsonl")
    code, output, manifest = run(NIGHTS[2])
    assert code == 1, output
    assert manifest["counts"]["shards"] == 2 and manifest["counts"]["shards_reused"] == 1
    assert manifest["counts"]["scored"] == 20
    [scored] = [s for s in manifest["shards"] if not s["reused"]]
    assert scored["source"].endswith("late.jsonl")
