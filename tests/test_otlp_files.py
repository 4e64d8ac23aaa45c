"""`otel` on OTLP files as OpenTelemetry writes them: the scripted support conversation (tests/producers.py) traced
by the real GenAI instrumentation, its spans and log records encoded by the SDK's own OTLP encoders (the OTLP JSON
file exporter, one export per line; the protobuf encoder), laid out as the Collector's `file` exporter (rotated,
gzip, zstd, length-prefixed protobuf) and S3 exporter (time-partitioned keys, one export per object) write them.
Every form reads to exactly the rollouts of today's form (all spans in one OTLP JSON document, `spans.json`), and
content carried by GenAI log records scores to exactly the steps of the same conversation with the content on its
spans."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import zstandard
from conftest import s3_filesystem
from producers import EXPECTED_STEPS, pexec, stub_server, verdicts

from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest, otlp
from pipeline.replay.checker import replay

PRODUCERS = Path(__file__).with_name("producers.py")
LATEST = {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"}
CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
RUNS = {  # name: (environment, tool spans)
    "spans": (LATEST | {CONTENT: "SPAN_ONLY"}, "yes"),  # today's form, with tool spans
    "client": (LATEST | {CONTENT: "SPAN_ONLY"}, "no"),  # the instrumented client alone, content on its spans
    "events": ({CONTENT: "true"}, "no"),  # no opt-in: content in per-message log events (v1.30 conventions)
    "details": (LATEST | {CONTENT: "EVENT_ONLY"}, "no"),  # opt-in, content in one details event per chat
}


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> dict[str, Path]:
    """One producer process per run, side by side (the conventions are chosen once per process)."""
    root = tmp_path_factory.mktemp("otlp")
    with stub_server() as stub:
        procs = {}
        for name, (extra, tools) in RUNS.items():
            (root / name).mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | extra
            args = [sys.executable, str(PRODUCERS), "otel-files", stub.base_url, str(root / name), tools]
            procs[name] = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{name}: {err}"
    return {name: root / name for name in RUNS}


def read(*paths: Path | str, **extra: str) -> list[dict]:
    return list(ingest("otel", [str(p) for p in paths], IngestOptions(extra=extra)))


def frames(path: Path) -> list[bytes]:
    """The messages of a length-prefixed file (4 bytes, big-endian, then the message)."""
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        out.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def prefixed(messages: list[bytes]) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


def steps(record: dict) -> list[tuple]:
    env = get_environment("observed", EnvOptions(spec="support"))
    return [(s.tool, s.valid, s.failed_check, s.decided_by, s.detail) for s in replay(env, parse_rollout(record)).steps]


def test_the_file_exporters_forms_read_to_todays_rollouts(produced, tmp_path):
    run = produced["spans"]
    [reference] = read(run / "spans.json")
    assert verdicts([{"tool": t, "valid": v, "failed_check": c} for t, v, c, *_ in steps(reference)]) == EXPECTED_STEPS
    lines = (run / "traces.jsonl").read_bytes().splitlines(keepends=True)
    messages = frames(run / "traces.pb")
    assert len(lines) == len(messages) >= 8  # one export per span, each a line and a message
    zstd = zstandard.ZstdCompressor()
    third = len(lines) // 3
    rotated = tmp_path / "rotated"  # the live file and two backups named as the Collector's rotation names them
    rotated.mkdir()
    (rotated / "traces-2026-11-29T12-00-00.000-size.jsonl").write_bytes(b"".join(lines[:third]))
    (rotated / "traces-2026-11-29T13-00-00.000-size.jsonl").write_bytes(b"".join(lines[third : 2 * third]))
    (rotated / "traces.jsonl").write_bytes(b"".join(lines[2 * third :]))
    forms = {
        "traces.jsonl": b"".join(lines),  # format: json
        "traces.jsonl.gz": gzip.compress(b"".join(lines)),  # gzip-rotated backups
        "native.jsonl.zst": b"".join(zstd.compress(line) for line in lines),  # native zstd: a frame per write
        "per-message.json": prefixed([zstd.compress(line.rstrip(b"\n")) for line in lines]),  # default zstd
        "traces.pb": (run / "traces.pb").read_bytes(),  # format: proto
        "traces.pb.zst": prefixed([zstd.compress(m) for m in messages]),  # format: proto, compression: zstd
    }
    for name, data in forms.items():
        (tmp_path / name).write_bytes(data)
        assert read(tmp_path / name) == [reference], name
    assert read(rotated) == [reference]


def test_the_s3_exporters_partitions_read_with_a_date_glob(produced, s3, tmp_path):
    """`otlp_json`, `otlp_proto` and gzip objects under year=/month=/day=/hour=/minute=; a glob picks two days."""
    run = produced["spans"]
    [reference] = read(run / "spans.json")
    fs = s3_filesystem(s3)
    lines = (run / "traces.jsonl").read_bytes().splitlines()
    messages = frames(run / "traces.pb")
    root = "pexec-test/otel-s3"
    for i, (line, message) in enumerate(zip(lines, messages, strict=True)):
        day, minute = 28 + i % 2, i % 3  # the conversation's exports fall into two days and several minutes
        prefix = f"{root}/json/year=2026/month=11/day={day}/hour=23/minute={minute:02d}"
        fs.pipe(
            f"{prefix}/traces_{100000000 + i}.json" + (".gz" if i % 2 else ""), gzip.compress(line) if i % 2 else line
        )
        prefix = f"{root}/proto/year=2026/month=11/day={day}/hour=23/minute={minute:02d}"
        fs.pipe(f"{prefix}/traces_{200000000 + i}.binpb", message)
    fs.pipe(f"{root}/json/year=2026/month=11/day=30/hour=00/minute=00/traces_300000000.json", lines[0])  # not read
    options = IngestOptions(storage_options=s3)
    for marshaler in ("json", "proto"):
        url = f"s3://{root}/{marshaler}/year=2026/month=11/day=2[89]/"
        assert list(ingest("otel", [url], options)) == [reference], marshaler
    assert list(ingest("otel", [f"s3://{root}/json/"], options)) != [reference]  # day=30 holds a copy of a span
    url = f"s3://{root}/json/year=2026/month=11/day=2*/hour=23/"
    [scored] = pexec_steps(url, tmp_path, "--endpoint-url", s3["endpoint_url"]).values()
    assert verdicts(scored) == EXPECTED_STEPS


@pytest.mark.parametrize("run", ["events", "details"])
def test_content_in_log_records_scores_as_content_on_spans(produced, run, tmp_path):
    """The same conversation, its content in GenAI log records instead of span attributes: the same calls
    (arguments, outputs) and the same steps, read from OTLP JSON lines and from protobuf alike."""
    [client] = read(produced["client"] / "spans.json")
    expected = steps(client)
    assert [s[:3] for s in expected] == EXPECTED_STEPS
    for pair in (("traces.jsonl", "logs.jsonl"), ("traces.pb", "logs.pb")):
        [record] = read(*(produced[run] / name for name in pair))
        calls = [e for e in record["events"] if e["type"] == "call"]
        assert [(c["tool"], c["call_id"]) for c in calls] == [(c["tool"], c["call_id"]) for c in client["events"]
                                                              if c["type"] == "call"]  # fmt: skip
        assert [_parsed(c["arguments"]) for c in calls] == [
            _parsed(c["arguments"]) for c in client["events"] if c["type"] == "call"
        ]
        assert [c.get("output") for c in calls] == [c.get("output") for c in client["events"] if c["type"] == "call"]
        assert steps(record) == expected, pair
    [alone] = read(produced[run] / "logs.jsonl", allow_no_calls="true")  # log records with no span exported
    assert steps(alone) == expected
    without = read(produced[run] / "traces.jsonl", allow_no_calls="true")  # the spans alone carry no call
    assert [e for r in without for e in r["events"] if e["type"] == "call"] == []


def _parsed(arguments: object) -> object:
    """The v1.30 events keep the arguments as the model's JSON text; the latest conventions as an object."""
    return orjson.loads(arguments) if isinstance(arguments, str) else arguments


def pexec_steps(source: str | Path, tmp: Path, *ingest_args: str) -> dict[str, list[dict]]:
    """`pexec ingest otel SOURCE` then `pexec score --env observed --spec support --inline`: rollout id -> steps."""
    import pyarrow.parquet as pq

    tmp.mkdir(exist_ok=True)
    pexec("ingest", "otel", str(source), "--out", "store", *ingest_args, cwd=tmp)
    pexec("score", "store", "--out", "run", "--env", "observed", "--spec", "support", "--inline", cwd=tmp)
    out: dict[str, list[dict]] = {}
    for s in sorted(pq.read_table(tmp / "run" / "steps").to_pylist(), key=lambda s: (s["rollout_id"], s["step"])):
        out.setdefault(s["rollout_id"], []).append(s)
    return out


def test_pexec_ingest_reads_the_events_end_to_end(produced, tmp_path):
    """A folder as a Collector leaves it (traces and logs pipelines each to its file exporter), ingested and scored
    by `pexec`: the steps of the same conversation with its content on the spans."""
    [client] = read(produced["client"] / "spans.json")
    folder = tmp_path / "collector"
    folder.mkdir()
    for name in ("traces.jsonl", "logs.jsonl"):
        (folder / name).write_bytes((produced["events"] / name).read_bytes())
    [scored] = pexec_steps(folder, tmp_path / "b").values()
    keep = ("tool", "valid", "failed_check", "decided_by", "detail")
    assert [tuple(s[k] for k in keep) for s in scored] == steps(client)


def test_a_malformed_message_is_a_one_line_reject(produced, tmp_path):
    lines = (produced["spans"] / "traces.jsonl").read_bytes().splitlines(keepends=True)
    bad = tmp_path / "traces.jsonl"
    bad.write_bytes(lines[0] + b'{"resourceSpans": [\n' + b"".join(lines[1:]))
    items = list(otlp.records(str(bad)))
    rejects = [i for i in items if isinstance(i, otlp.Malformed)]
    assert [r.where for r in rejects] == [f"{bad} line 2"] and rejects[0].reason.startswith("not JSON")
    assert len(items) - 1 == len(lines)  # every other line still read, a span each
    proc = subprocess.run([str(Path(sys.executable).with_name("pexec")), "ingest", "otel", str(bad), "--out", "s"],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: otel: {bad} line 2: {rejects[0].reason}"]


def test_framing_errors_are_rejects_and_reading_goes_on(produced, tmp_path, monkeypatch):
    messages = frames(produced["spans"] / "traces.pb")
    path = tmp_path / "traces.pb"
    path.write_bytes(prefixed(messages[:2]) + (10**9).to_bytes(4, "big") + b"x" * 10 + prefixed(messages[2:3]))
    items = list(otlp.records(str(path)))
    reasons = [(i.where.rsplit(" ", 2)[-2:], i.reason) for i in items if isinstance(i, otlp.Malformed)]
    assert reasons == [(["message", "3"], f"a message of {10**9} bytes, over the limit of {otlp.MAX_MESSAGE_BYTES}")]
    assert len(items) == 3  # the file ends inside the oversized message: the two spans before it are read
    path.write_bytes(prefixed(messages[:1])[:-3])
    assert [i.reason for i in otlp.records(str(path))] == [
        f"the file ends inside the message ({len(messages[0]) - 3} of {len(messages[0])} bytes)"
    ]
    lines = (produced["spans"] / "traces.jsonl").read_bytes().splitlines(keepends=True)
    monkeypatch.setattr(otlp, "MAX_MESSAGE_BYTES", max(len(line) for line in lines[1:]) + 1)
    long = tmp_path / "long.jsonl.zst"
    long.write_bytes(zstandard.ZstdCompressor().compress(b'{"resourceSpans": []' + b" " * 10**6 + b"}\n" + lines[1]))
    items = list(otlp.records(str(long)))
    assert isinstance(items[0], otlp.Malformed) and items[0].where == f"{long} line 1"
    assert items[0].reason.startswith("a line over") and items[1]["signal"] == "span"
    whole = b"".join(lines)
    for name, data in (("cut.jsonl.gz", gzip.compress(whole)), ("cut.jsonl.zst", zstandard.compress(whole))):
        (tmp_path / name).write_bytes(data[: len(data) // 2])  # a compressed file cut short: one reject, at its end
        *spans, cut = otlp.records(str(tmp_path / name))
        assert isinstance(cut, otlp.Malformed) and cut.where == str(tmp_path / name), name
        assert all(s["signal"] == "span" for s in spans)
    (tmp_path / "junk.bin").write_bytes(b"\x93NUMPY")
    [junk] = otlp.records(str(tmp_path / "junk.bin"))
    assert isinstance(junk, otlp.Malformed) and junk.reason.startswith("not OTLP")


def test_a_zstd_bomb_line_is_rejected_in_bounded_memory(tmp_path):
    """A 1 GiB line in a 33 KB zstd file: one reject naming it, and the process stays far below the line's size.
    Its peak is VmHWM: ru_maxrss would carry the peak of the pytest worker that started it."""
    script = """
import json, sys, zstandard
from pipeline.ingest import otlp
with open(sys.argv[1], "wb") as f, zstandard.ZstdCompressor().stream_writer(f) as w:
    w.write(b'{"resourceSpans": [')
    for _ in range(1024):
        w.write(b" " * 2**20)
    w.write(b']}\\n{"resourceSpans": []}\\n')
items = list(otlp.records(sys.argv[1]))
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"rejects": [[i.where.rsplit(" ", 1)[-1], i.reason] for i in items], "rss_kib": rss}))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "bomb.jsonl.zst")], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout)
    assert out["rejects"] == [["1", f"a line over {otlp.MAX_MESSAGE_BYTES} bytes"]]
    assert out["rss_kib"] < 400 * 1024  # the limit (64 MiB) plus the interpreter and its libraries, not the 1 GiB


def test_the_second_round_rekeys_traces_without_log_records_as_regrouping_them_would(produced, tmp_path, monkeypatch):
    """Round 2 of the shuffle rekeys a trace without log records from the conversation its spans name, without
    decoding it (`Shuffle.rekey`), and regroups the others: the final partitions hold the same items under the same
    keys as when every trace is regrouped, over every form the SDK writes and a night of the support sample."""
    from dataclasses import replace

    from pipeline.ingest.otel import SHUFFLE
    from pipeline.ingest.sharded import RawSource, plan_raw, raw_source
    from pipeline.scoring.shuffle import _read, map_shard, partition_shards, regroup_partition
    from pipeline.synthetic.support_spans import write_spans

    write_spans(tmp_path / "night", 60, files=2, encoding="proto")
    sources = [str(produced[name]) for name in RUNS] + [str(tmp_path / "night")]
    out, whole = {}, {}
    for name in ("rekeyed", "regrouped"):
        if name == "regrouped":
            monkeypatch.setattr(RawSource, "shuffle", property(lambda self: replace(SHUFFLE, rekey=None)))
        source, run = raw_source("otel", sources, IngestOptions()), str(tmp_path / name)
        shards = plan_raw(source, 2**20)
        for shard in shards:
            map_shard(source, run, shard, 3, 2, 2**20)
        whole[name] = sorted(
            {w for p in range(3) for t in _read(run, 1, p, p + 1, None) for w in t["whole"].to_pylist()}
        )
        for shard in partition_shards(source, run, shards, 3, 1, per_task=2):
            regroup_partition(source, run, shard, 3, 2**20)
        out[name] = sorted(
            (
                p,
                row["key"],
                row["start"],
                row["item_id"],
                orjson.dumps(orjson.loads(row["payload"]), option=orjson.OPT_SORT_KEYS),
            )
            for p in range(3)
            for t in _read(run, 2, p, p + 1, None)
            for row in t.select(["key", "start", "item_id", "payload"]).to_pylist()
        )
    assert whole == {"rekeyed": [False, True], "regrouped": [True]}  # both ways taken, then none but the full one
    assert len(out["rekeyed"]) > 600 and out["rekeyed"] == out["regrouped"]
