"""`pexec score SOURCE --format FMT`: raw logs scored where they lie, their adapter run inside the scoring tasks
over files, byte ranges and archive members, give exactly the steps and rollouts of `pexec ingest` then
`pexec score`, on the shared real logs and on logs written by the formats' own producers; OTel spans spread
over several files are assembled by the shuffle as if they were in one file."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_producers_inspect import eval_log  # noqa: F401  (a fixture: a real .eval written by inspect_ai)
from typer.testing import CliRunner

from pipeline.apps.cli.app import app
from pipeline.core.errors import PexecError
from pipeline.ingest import IngestOptions, ingest
from pipeline.ingest.sharded import plan_raw, raw_source
from pipeline.metrics.run import open_run
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.inputs import line_shards, list_inputs
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize
from pipeline.synthetic.support_logs import write_night, write_samples

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "real"
RUNNER = CliRunner()


def rows(run: Path) -> tuple[list[tuple], list[tuple]]:
    """The run's steps and rollouts, every column but run_id, as sorted tuples: equal runs score the same."""
    handle = open_run(str(run))

    def table(t: Any) -> list[tuple]:
        names = sorted(n for n in t.column_names if n != "run_id")
        return sorted((tuple((n, repr(r[n])) for n in names) for r in t.to_pylist()), key=repr)

    return table(handle.steps()), table(handle.rollouts())


def ingest_then_score(fmt: str, sources: list[str], tmp: Path, read: dict[str, str], **score: Any) -> Path:
    store, run = tmp / "store", tmp / "ingested"
    write_store(ingest(fmt, sources, IngestOptions(extra=dict(read))), str(store))
    run_scoring(str(store), str(run), ScoreSettings(inline=True, **score))
    return run


def score_raw(fmt: str, sources: list[str], tmp: Path, read: dict[str, str], name: str = "raw", **score: Any) -> Path:
    run = tmp / name
    score.setdefault("inline", True)
    run_scoring(sources, str(run), ScoreSettings(format=fmt, options=read, **score))
    return run


def assert_same(a: Path, b: Path) -> None:
    steps_a, rollouts_a = rows(a)
    steps_b, rollouts_b = rows(b)
    assert rollouts_a and rollouts_a == rollouts_b
    assert steps_a == steps_b


def test_openai_logs_cut_into_byte_ranges_score_on_ray_as_ingest_then_score(tmp_path, shared_ray):
    write_samples(tmp_path / "logs", ("2026-11-27", "2026-11-28"), 40, 3)
    options = {"error_prefix": "Error:"}
    env = {"spec": "support"}
    ingested = ingest_then_score("openai", [str(tmp_path / "logs")], tmp_path, options, **env)
    # 4 KiB shards: every file is cut into byte ranges, decoded in Ray tasks
    raw = score_raw("openai", [str(tmp_path / "logs")], tmp_path, options, shard_mb=4096 / 2**20, inline=False, **env)
    manifest = json.loads((raw / "_manifest.json").read_text())
    assert manifest["counts"]["shards"] > 4 and manifest["settings"]["executor"] == "ray"
    assert_same(ingested, raw)


def test_a_gzip_cut_by_decompressed_bytes_scores_on_ray_as_read_whole_and_a_rerun_reuses_its_ranges(
    tmp_path, shared_ray
):
    """One gzip file, its ranges streamed to the tasks by one reader: the same rows, rejects (named by line) and
    duplicate-id verdicts as the file scored whole in this process; a rerun reuses every range, and one whose
    part went missing is scored again while the others' ids are read back through the reader."""
    [path] = write_night(tmp_path / "logs", 300, files=1)
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join([*lines, b"[1, 2]\n", *lines[:3], *lines[150:152]])))  # later copies
    options, env = {"error_prefix": "Error:"}, {"spec": "support"}
    whole = score_raw("openai", [str(path)], tmp_path, options, name="whole", **env)
    split = score_raw("openai", [str(path)], tmp_path, options, name="split", shard_mb=64 / 1024, inline=False, **env)
    manifest = json.loads((split / "_manifest.json").read_text())
    assert manifest["counts"]["shards"] > 4 and manifest["settings"]["executor"] == "ray"
    assert_same(whole, split)

    def rejects(run: Path) -> list[tuple[str, str]]:
        return sorted((r["location"], r["reason"]) for r in open_run(str(run)).rejects().to_pylist())

    assert rejects(whole) == rejects(split) and len(rejects(whole)) == 6
    assert [loc for loc, _ in rejects(split)] == [f"line {n}" for n in range(301, 307)]
    assert rejects(split)[-1][1].endswith(f"{path} line 152)")  # a later copy names the first by its line

    again = run_scoring([str(path)], str(split), ScoreSettings(format="openai", options=options, shard_mb=64 / 1024,
                                                               **env))  # fmt: skip
    assert again.counts.shards_reused == again.counts.shards
    next(split.glob("rollouts/part-*.parquet")).unlink()
    again = run_scoring([str(path)], str(split), ScoreSettings(format="openai", options=options, shard_mb=64 / 1024,
                                                               **env))  # fmt: skip
    assert again.counts.shards_reused == again.counts.shards - 1
    assert_same(whole, split)
    assert rejects(whole) == rejects(split)


@pytest.mark.parametrize("inline", [True, False])
def test_a_gzip_changed_between_its_plan_and_its_read_fails_the_run(tmp_path, shared_ray, inline):
    """Its ranges were planned on the stream as it was: another stream of the same size fails its checksum in the
    reader, and the run fails with one line and commits nothing."""
    [path] = write_night(tmp_path / "logs", 200, files=1)

    def change(_: object) -> None:  # after the plan, before any range is read
        data = bytearray(path.read_bytes())
        data[-8] ^= 0xFF  # the CRC of the stream's one member
        path.write_bytes(bytes(data))

    settings = ScoreSettings(format="openai", options={"error_prefix": "Error:"}, spec="support",
                             shard_mb=64 / 1024, inline=inline)  # fmt: skip
    with pytest.raises(PexecError, match="changed since it was planned") as failed:
        run_scoring([str(path)], str(tmp_path / "run"), settings, on_plan=change)
    assert "\n" not in str(failed.value)
    assert not (tmp_path / "run" / "_manifest.json").exists()


def test_ids_missing_in_a_byte_range_are_named_by_their_line_as_a_whole_file_read_names_them(tmp_path):
    write_samples(tmp_path / "logs", ("2026-11-27",), 12, 5)
    [path] = (tmp_path / "logs").rglob("*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in d.items() if k != "id"}) + "\n" for d in lines))
    options = {"error_prefix": "Error:"}
    ingested = ingest_then_score("openai", [str(path)], tmp_path, options)
    raw = score_raw("openai", [str(path)], tmp_path, options, shard_mb=2048 / 2**20)
    ids = sorted(r["rollout_id"] for r in open_run(str(raw)).rollouts().to_pylist())
    assert ids == sorted(f"{path} line {n}" for n in range(1, 13))
    assert_same(ingested, raw)


def test_the_shared_real_tau2_and_bfcl_logs_score_as_ingest_then_score(tmp_path):
    if not SHARED.is_dir():
        pytest.fail(f"the shared real logs are missing: {SHARED} (../shared/data must be beside the project)")
    tau = str(SHARED / "tau2" / "retail_gpt-4.1.json")  # read by its format's own reader, one source per task
    assert_same(ingest_then_score("tau2", [tau], tmp_path / "t", {}), score_raw("tau2", [tau], tmp_path / "t", {}))
    bfcl = str(SHARED / "bfcl" / "gpt-oss-120b" / "BFCL_v4_multi_turn_miss_param_result.json")
    assert_same(ingest_then_score("bfcl", [bfcl], tmp_path / "b", {}), score_raw("bfcl", [bfcl], tmp_path / "b", {}))


def test_toolsandbox_run_folders_score_as_ingest_then_score(tmp_path):
    source = str(ROOT / "tests" / "data" / "toolsandbox")
    assert_same(
        ingest_then_score("toolsandbox", [source], tmp_path, {}), score_raw("toolsandbox", [source], tmp_path, {})
    )


def test_through_the_cli_with_labels(tmp_path, shared_ray):
    write_samples(tmp_path / "logs", ("2026-11-27",), 10, 1)
    args = ["--option", "error_prefix=Error:", "--label", "night=one", "--spec", "support"]
    result = RUNNER.invoke(
        app, ["score", str(tmp_path / "logs"), "--format", "openai", "--out", str(tmp_path / "r"), *args]
    )
    assert result.exit_code == 0, result.output
    assert "scored 10" in result.output
    assert {r["night"] for r in open_run(str(tmp_path / "r")).rollouts().to_pylist()} == {"one"}
    bad = RUNNER.invoke(
        app, ["score", str(tmp_path / "logs"), "--format", "openai", "--option", "nope=1", "--out", "x"]
    )
    assert bad.exit_code == 2 and "unknown option(s) nope" in bad.output


def test_ingest_decodes_the_same_shards_on_ray_and_writes_the_same_store(tmp_path, shared_ray):
    write_samples(tmp_path / "logs", ("2026-11-27", "2026-11-28"), 20, 2)
    args = ["ingest", "openai", str(tmp_path / "logs"), "--option", "error_prefix=Error:"]
    here = RUNNER.invoke(app, [*args, "--out", str(tmp_path / "here")])
    on_ray = RUNNER.invoke(app, [*args, "--out", str(tmp_path / "ray"), "--ray"])
    assert here.exit_code == 0 and on_ray.exit_code == 0, (here.output, on_ray.output)
    assert "wrote 40 rollouts" in on_ray.output
    lines = {
        name: b"".join(p.read_bytes() for p in sorted((tmp_path / name).glob("*.jsonl"))) for name in ("here", "ray")
    }
    assert lines["here"] == lines["ray"] and lines["here"].count(b"\n") == 40
    [path] = (tmp_path / "logs" / "date=2026-11-28").glob("*.jsonl")
    path.write_bytes(path.read_bytes() + b"[1, 2]\n")  # all or nothing: one bad line and nothing is written
    bad = RUNNER.invoke(app, [*args, "--out", str(tmp_path / "bad"), "--ray"])
    assert bad.exit_code == 2 and "line 21" in bad.output and not (tmp_path / "bad").exists(), bad.output


def test_ingest_cuts_a_gzip_by_shard_mb_and_writes_the_same_store_here_and_on_ray(tmp_path, shared_ray):
    [path] = write_night(tmp_path / "logs", 400, files=1)
    args = ["ingest", "openai", str(path), "--option", "error_prefix=Error:"]
    runs = {
        "whole": RUNNER.invoke(app, [*args, "--out", str(tmp_path / "whole")]),
        "here": RUNNER.invoke(app, [*args, "--out", str(tmp_path / "here"), "--shard-mb", str(64 / 1024)]),
        "ray": RUNNER.invoke(app, [*args, "--out", str(tmp_path / "ray"), "--shard-mb", str(64 / 1024), "--ray"]),
    }
    assert all(r.exit_code == 0 and "wrote 400 rollouts" in r.output for r in runs.values()), runs
    stores = {name: b"".join(p.read_bytes() for p in sorted((tmp_path / name).glob("*.jsonl"))) for name in runs}
    assert stores["whole"] == stores["here"] == stores["ray"] and stores["whole"].count(b"\n") == 400
    assert len(line_shards(list_inputs(str(path))[0], 64 * 1024)) > 4  # the file was cut
    bad = RUNNER.invoke(app, [*args, "--out", str(tmp_path / "bad"), "--shard-mb", "0"])
    assert bad.exit_code == 2 and "--shard-mb takes a size > 0" in bad.output and not (tmp_path / "bad").exists()


# -- OTel: one conversation's spans in three files ------------------------------------------------------


@pytest.fixture(scope="module")
def otel_export(tmp_path_factory) -> Path:
    """OTLP JSON written by the OpenTelemetry SDK's own encoder (tests/producers.py)."""
    from producers import stub_server
    from test_producers_otel import produce

    with stub_server() as stub:
        return produce(stub, tmp_path_factory.mktemp("otel") / "one.jsonl", capture=True)


def spread(export: Path, folder: Path, files: int) -> int:
    """The export's spans, each in its own copy of its resource and scope, dealt round-robin over `files` files:
    what a rotating exporter writes when a conversation lasts longer than a file."""
    folder.mkdir()
    out: list[list[str]] = [[] for _ in range(files)]
    n = 0
    for line in export.read_text().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    one = {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [span]}]}]}
                    out[n % files].append(json.dumps(one))
                    n += 1
    for i, lines in enumerate(out):
        (folder / f"spans-{i}.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    return n


def test_one_conversations_spans_in_three_files_score_as_in_one_file(tmp_path, shared_ray, otel_export):
    export = otel_export
    assert spread(export, tmp_path / "three", 3) >= 6
    spec = {"env": "observed", "spec": "support"}
    ingested = ingest_then_score("otel", [str(export)], tmp_path, {}, **spec)
    one = score_raw("otel", [str(export)], tmp_path, {}, "one", **spec)
    three = score_raw(
        "otel", [str(tmp_path / "three")], tmp_path, {}, "run-three", shard_mb=512 / 2**20, inline=False, **spec
    )
    assert_same(ingested, one)
    assert_same(one, three)
    manifest = json.loads((three / "_manifest.json").read_text())
    assert manifest["counts"]["shards"] > 1 and len(manifest["input"]["files"]) == 3
    assert not (three / "_staging").exists()


# -- Inspect: archive members --------------------------------------------------------------------------


def test_an_inspect_log_cut_into_member_ranges_scores_as_ingest_then_score(tmp_path, eval_log):  # noqa: F811
    log = eval_log
    copies = tmp_path / "logs"
    copies.mkdir()
    shutil.copy(log, copies / "a.eval")
    spec = {"env": "observed", "spec": "support"}
    ingested = ingest_then_score("inspect", [str(copies)], tmp_path, {}, **spec)
    raw = score_raw("inspect", [str(copies)], tmp_path, {}, shard_mb=1 / 2**20, **spec)
    assert json.loads((raw / "_manifest.json").read_text())["counts"]["shards"] == 2  # one per sample member
    assert_same(ingested, raw)


SPANS_RSS_CEILING_MIB = 400  # a scoring process (`--inline`) over a night of spans, whatever the night's size


def night_of_spans(export: Path, folder: Path, conversations: int, files: int) -> int:
    """`conversations` copies of the export's conversation, each with its own trace, span and conversation ids,
    their spans dealt over `files` files in reverse order (a conversation's spans in every file)."""
    folder.mkdir()
    spans = [
        (rs, ss, span)
        for line in export.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    out: list[list[str]] = [[] for _ in range(files)]
    n = 0
    for c in range(conversations):
        for rs, ss, span in spans:
            attrs = [
                {"key": a["key"], "value": {"stringValue": f"conv-{c}"}} if a["key"] == "gen_ai.conversation.id" else a
                for a in span.get("attributes", [])
            ]
            copy = {**span, "traceId": f"{c:032x}", "spanId": f"{c:08x}{n % 2**32:08x}", "attributes": attrs}
            copy.pop("parentSpanId", None)
            out[n % files].append(json.dumps({"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [copy]}]}]}))
            n += 1
    for i, lines in enumerate(out):
        (folder / f"spans-{i}.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    return n


@pytest.mark.memory
def test_a_night_of_spans_scores_in_partitions_with_memory_flat_in_the_nights_size(tmp_path, otel_export):
    from test_read_bounds import pexec_rss

    peaks = {}
    for conversations in (300, 1200):  # from 300 on, past a partition of 256 KiB: 150 took 12-22 MiB less
        spans = night_of_spans(otel_export, tmp_path / f"night-{conversations}", conversations, 4)
        args = ["score", f"night-{conversations}", "--format", "otel", "--out", f"run-{conversations}", "--inline",
                "--shard-mb", "0.25", "--env", "observed", "--spec", "support"]  # fmt: skip
        proc, peaks[conversations] = pexec_rss(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        manifest = json.loads((tmp_path / f"run-{conversations}" / "_manifest.json").read_text())
        assert manifest["counts"]["scored"] == conversations and manifest["counts"]["rejected"] == 0, spans
        # a partition per 256 KiB of input, and no task's run of partitions much above its share: a task holds
        # one partition at a time
        shards = manifest["shards"]
        partitions = sum(s["stop"] - s["start"] for s in shards)
        assert partitions >= 4 * conversations // 150, shards
        assert max(s["read"] / (s["stop"] - s["start"]) for s in shards) <= 2 * conversations / partitions, shards
    assert peaks[1200] < SPANS_RSS_CEILING_MIB, peaks
    # four times the spans, about the same peak (bounded by partition): under 30 MiB more, a process's noise
    assert peaks[1200] - peaks[300] < 30, peaks


@pytest.mark.memory
def test_a_file_that_cannot_be_cut_is_mapped_with_memory_flat_in_the_files_size(tmp_path):
    """A length-prefixed protobuf file (the OpenTelemetry SDK's own encoder) is one shard whatever its size: the
    task that reads it spills its rows to local disk past a shard size of them, so a file four times larger
    takes about the same memory, and every conversation is scored once. Without the spill a file eight times
    larger took 133 MiB more (191 against 324 MiB); with it, two runs of one command differ by up to 25 MiB."""
    from test_read_bounds import pexec_rss

    from pipeline.synthetic.support_spans import write_spans

    peaks, files = {}, {}
    for conversations in (500, 4000):
        folder = tmp_path / f"spans-{conversations}"
        write_spans(folder, conversations, files=1, encoding="proto")
        [files[conversations]] = folder.iterdir()
        args = ["score", folder.name, "--format", "otel", "--out", f"run-{conversations}", "--inline",
                "--shard-mb", "0.25", "--env", "observed", "--spec", "support"]  # fmt: skip
        proc, peaks[conversations] = pexec_rss(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        counts = json.loads((tmp_path / f"run-{conversations}" / "_manifest.json").read_text())["counts"]
        assert counts["scored"] == conversations and counts["rejected"] == 0
    assert files[4000].stat().st_size > 60 * 0.25 * 2**20  # one shard, sixty shard sizes and more
    assert peaks[4000] - peaks[500] < 50, peaks  # MiB: a file eight times larger, about the same peak


def test_the_staged_spans_take_less_room_than_the_file_they_came_from(tmp_path):
    """Round 1 stages every span as JSON with its place; compressed, the staging area of a protobuf file (the SDK's
    own encoder) is smaller than the file itself (plain, it was five times larger), and reads back whole. Each task
    of a round writes one file, whatever the number of partitions, and a task may take any run of consecutive
    partitions."""
    from pipeline.scoring.shuffle import map_shard, partition_shards, read_partition, regroup_partition
    from pipeline.synthetic.support_spans import write_spans

    written = write_spans(tmp_path / "spans", 300, files=1, encoding="proto")
    [path] = (tmp_path / "spans").iterdir()
    source = raw_source("otel", [str(tmp_path / "spans")], IngestOptions())
    [shard] = plan_raw(source, 2**20)
    run = str(tmp_path / "run")
    assert map_shard(source, run, shard, 4, 2, 2**20) == written
    staged = sum(f.stat().st_size for f in (tmp_path / "run").rglob("*.shuffle"))
    assert 0 < staged < path.stat().st_size, (staged, path.stat().st_size)
    partitions = partition_shards(source, run, [shard], 4, 1, per_task=2)
    assert [(p.start, p.stop) for p in partitions] == [(0, 2), (2, 4)]
    assert sum(regroup_partition(source, run, p, 4, 2**20) for p in partitions) == written
    # One object per task of a round, whatever the partitions: 1 map task, then 2 regrouping tasks.
    area = tmp_path / "run" / "_staging"
    assert [len(list((area / r).glob("*.shuffle"))) for r in ("round1", "round2")] == [1, 2]
    for per_task in (1, 3):  # read in runs other than those written
        final = partition_shards(source, run, [shard], 4, 2, per_task)
        ids = [r["rollout_id"] for p in final for _, r in read_partition(source, run, p)]
        assert len(ids) == len(set(ids)) == 300  # every conversation, assembled once


def test_a_trace_that_cannot_be_regrouped_is_a_reject_of_the_conversation_it_names(tmp_path, monkeypatch):
    """A trace round 2 cannot regroup (the format's `regroup` raises) is one reject at the key of the conversation
    it names, as a trace over the item limit is, and no conversation is assembled without it; every other
    conversation is assembled once."""
    from dataclasses import replace

    from pipeline.ingest.otel import CONVERSATION, SHUFFLE
    from pipeline.ingest.sharded import RawSource
    from pipeline.scoring.shuffle import map_shard, partition_shards, read_partition, regroup_partition
    from pipeline.storage.shards import RecordError
    from pipeline.synthetic.support_spans import write_spans

    failed: list[str] = []

    def regroup(trace: str, items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        if not failed:
            failed.extend({str(i["attrs"][CONVERSATION]) for i in items})
            raise ValueError("this trace cannot be regrouped")
        return SHUFFLE.regroup(trace, items)

    def rekey(item: dict[str, Any]) -> tuple[str | None, bool]:
        return SHUFFLE.rekey(item)[0], True  # every trace decoded in round 2, as one with log records is

    monkeypatch.setattr(RawSource, "shuffle", property(lambda self: replace(SHUFFLE, regroup=regroup, rekey=rekey)))
    write_spans(tmp_path / "spans", 30, files=1, encoding="proto")
    source, run = raw_source("otel", [str(tmp_path / "spans")], IngestOptions()), str(tmp_path / "run")
    [shard] = plan_raw(source, 2**20)
    map_shard(source, run, shard, 4, 2, 2**20)
    for partition in partition_shards(source, run, [shard], 4, 1):
        regroup_partition(source, run, partition, 4, 2**20)
    read = [r for p in partition_shards(source, run, [shard], 4, 2) for r in read_partition(source, run, p)]
    [victim] = failed  # one conversation a trace
    [(where, reject)] = [(where, r) for where, r in read if isinstance(r, RecordError)]
    assert where == f"key {victim}" and reject.reason.endswith("ValueError: this trace cannot be regrouped"), reject
    ids = sorted(r["rollout_id"] for _, r in read if not isinstance(r, RecordError))
    assert len(ids) == len(set(ids)) == 29 and victim not in ids


@pytest.mark.parametrize(("place", "partitions"), [("local", 9000), pytest.param("s3", 5, marks=pytest.mark.server)])
def test_each_partition_reads_back_from_every_tasks_object(place, partitions, tmp_path, request):
    """A round's tasks write one object each; partition p reads back exactly the rows its tasks wrote to p (none for
    an empty one), on local disk past the partitions the first read of an object's end covers, and on S3."""
    from pipeline.scoring.shuffle import _batch, _read, _write

    storage = request.getfixturevalue("s3") if place == "s3" else None
    run = "s3://pexec-test/shuffled" if storage else str(tmp_path / "run")

    def rows(task: str, partition: int):
        return _batch([(f"{task}-{partition}", 0, "i", b"{}", "f 1", None, None, False)] * 2)

    written = {"a": [0, 3, partitions - 1], "b": [3, 4]}  # partitions 1 and 2 have no rows
    for task, parts in written.items():
        _write(run, 2, task, ((p, rows(task, p)) for p in parts), partitions, storage)

    def expected(p: int) -> list[str]:
        return sorted(f"{t}-{p}" for t, parts in written.items() if p in parts for _ in range(2))

    for p in sorted({0, 1, 2, 3, 4, partitions - 1}):
        [table] = _read(run, 2, p, p + 1, storage)
        assert sorted(table["key"].to_pylist()) == expected(p), p
    together = [sorted(t["key"].to_pylist()) for t in _read(run, 2, 0, 5, storage)]
    assert together == [expected(p) for p in range(5)]


def test_a_worker_reads_each_objects_trailer_once_and_never_an_old_one(tmp_path, monkeypatch):
    """Reading every partition of a round reads each object's trailer once, then one range per partition it has
    rows for, or one range per object for a run of partitions; an object rewritten at the same path (a rerun) is
    read through its new trailer."""
    from fsspec.implementations.local import LocalFileSystem

    from pipeline.scoring import shuffle
    from pipeline.scoring.shuffle import _batch, _read, _write

    reads: list[tuple[str, int, int]] = []
    cat_file = LocalFileSystem.cat_file
    monkeypatch.setattr(LocalFileSystem, "cat_file", lambda fs, path, start=None, end=None, **kw: reads.append(
        (path, start, end)) or cat_file(fs, path, start=start, end=end, **kw))  # fmt: skip
    run = str(tmp_path / "run")

    def write(task: str, parts: list[int], tag: str, partitions: int = 6) -> None:
        batches = ((p, _batch([(f"{tag}{task}-{p}", 0, "i", b"{}", "f 1", None, None, False)])) for p in parts)
        _write(run, 2, task, batches, partitions, None)

    def keys(p: int) -> list[str]:
        [table] = _read(run, 2, p, p + 1, None)
        return sorted(table["key"].to_pylist())

    write("a", [0, 2, 5], "")
    write("b", [2, 3], "")
    shuffle._trailers.clear()
    assert [keys(p) for p in range(6)] == [["a-0"], [], ["a-2", "b-2"], ["b-3"], [], ["a-5"]]
    assert len(reads) == 2 + 5  # a trailer per object, then a range per (object, partition) with rows
    reads.clear()
    assert [sorted(t["key"].to_pylist()) for t in _read(run, 2, 0, 6, None)] == [keys(p) for p in range(6)]
    assert len(reads) == 2 + 5  # all six at once: one range per object (then each partition again, one at a time)
    write("a", [1, 2, 3, 4], "new-", partitions=5)  # rewritten: another size, another layout
    assert keys(1) == ["new-a-1"] and keys(2) == ["b-2", "new-a-2"] and keys(4) == ["new-a-4"]


@pytest.mark.parametrize(
    "tail", [b"PXSHUF01", struct.pack("<q", 2**40) + b"PXSHUF01", struct.pack("<q", -3) + b"PXSHUF01"]
)
def test_a_damaged_staging_object_is_a_one_line_error(tail, tmp_path):
    """An object of the round whose end is not a trailer this size can hold fails the partition's read in one line."""
    from pipeline.scoring import shuffle

    folder = tmp_path / "run" / "_staging" / "round2"
    folder.mkdir(parents=True)
    (folder / "x.shuffle").write_bytes(b"\0" * 100 + tail)
    with pytest.raises(OSError, match=r"x\.shuffle: not a shuffle object"):
        list(shuffle._read(str(tmp_path / "run"), 2, 0, 1, None))


_SPAN = st.tuples(
    st.sampled_from("abc"), st.integers(0, 3), st.sampled_from("xyz"), st.sampled_from([None, "c1", "c2"])
)


@settings(max_examples=60, deadline=None)
@given(spans=st.lists(_SPAN, max_size=12, unique_by=lambda s: (s[0], s[2])))
def test_a_trace_is_rekeyed_without_decoding_as_the_format_regroups_it(spans):
    """The arrow-only rekeying of round 2 gives every span of a trace without log records the key OTel's own
    regrouping gives it: its earliest (in time, then span id) span's conversation, else the trace."""
    import orjson
    import pyarrow as pa

    from pipeline.ingest import otel
    from pipeline.scoring.shuffle import _SCHEMA, _rekeyed

    payloads = [{"signal": "span", "trace_id": t, "start": s, "span_id": i, "attrs": {} if c is None else
                 {otel.CONVERSATION: c}} for t, s, i, c in spans]  # fmt: skip
    rows = [(p["trace_id"], p["start"], p["span_id"], orjson.dumps(p), "f", None, *otel.rekey(p)) for p in payloads]
    table = pa.Table.from_pylist([dict(zip(_SCHEMA.names, r, strict=True)) for r in rows], schema=_SCHEMA)
    rekeyed, rest = _rekeyed(table)
    assert rest.num_rows == 0
    got = sorted((r["item_id"], r["start"], r["key"]) for r in rekeyed.to_pylist())
    expected = sorted(
        (sp["span_id"], sp["start"], key)
        for trace in {p["trace_id"] for p in payloads}
        for key, sp in otel.regroup(trace, [p for p in payloads if p["trace_id"] == trace])
    )
    assert got == expected


def test_a_file_named_twice_or_inside_a_named_folder_is_scored_once(tmp_path):
    """Every rollout of the night is scored once: a file named twice, or named beside the folder that holds it, is
    planned once (planned twice, the duplicate-id check took each of its rollouts for a later copy of itself)."""
    files = write_samples(tmp_path / "logs", ("2026-11-28", "2026-11-29"), per_date=20)
    named = str(files[1])
    for i, sources in enumerate(([named, named], [str(tmp_path / "logs"), named], [named, f"{tmp_path}/logs/../logs/"
                                 f"date=2026-11-29/conversations.jsonl"])):  # fmt: skip
        out = tmp_path / f"run{i}"
        result = RUNNER.invoke(app, ["score", *sources, "--format", "openai", "--inline", "--out", str(out)])
        assert result.exit_code == 0, result.output
        manifest = open_run(str(out)).snapshot
        assert (manifest.scored(), manifest.rejected()) == (40 if i == 1 else 20, 0), sources


def test_a_run_folder_inside_its_input_is_refused_before_anything_is_written(tmp_path):
    """Inside the input, the run's own parts would be read back as logs by the next run, each a reject."""
    store = tmp_path / "store"
    write_store(synthesize("shop", 30, 5, seed=1), str(store), per_file=30)
    for out in (store / "run", store):
        result = RUNNER.invoke(app, ["score", str(store), "--inline", "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert "lies inside the input it scores" in result.output
    assert not (store / "run").exists() and not (store / "_manifest.json").exists()
    beside = RUNNER.invoke(app, ["score", str(store), "--inline", "--out", str(tmp_path / "store-run")])
    assert beside.exit_code == 0, beside.output  # a name that only starts like the input's is outside it
