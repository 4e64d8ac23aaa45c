"""The record limits hold before a record is decoded: a record over one (bytes decoded, objects and lists, spans of
one conversation) is a counted reject with its reason, the rest of its shard is scored, and the scoring process
stays under `RSS_CEILING_MIB` whatever the input. Inputs are made on the fly, small on disk; the large versions
(the sizes that took a worker to GBs) are marked `fuzz`."""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from test_producers_inspect import eval_log  # noqa: F401  (a fixture: a real .eval written by inspect_ai)
from test_read_bounds import RSS_CEILING_MIB, pexec_rss

from pipeline.storage.inputs import MAX_LINE_BYTES, MAX_ROW_GROUP_BYTES
from pipeline.storage.stores import _to_arrow
from pipeline.synthetic.rollouts import synthesize

MIB = 1 << 20
# OTel: round 1 of the shuffle stages a conversation's items up to max_conversation_items per input shard before
# the group is found over it (~5 KiB each while staged): 1M spans in one trace peak at ~720 MiB.
OTEL_RSS_CEILING_MIB = 1024


def score(tmp: Path, source: str, *extra: str) -> tuple[dict, list[dict], float]:
    args = ["score", source, "--out", "run", "--inline", *extra]
    proc, rss = pexec_rss(*args, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(f"{source}: peak RSS {rss:.0f} MiB")
    counts = json.loads((tmp / "run" / "_manifest.json").read_text())["counts"]
    return counts, pq.read_table(tmp / "run" / "rejects").to_pylist(), rss


# -- Parquet stores ---------------------------------------------------------------------------------------


def parquet_store(path: Path, good: int, big: int, value_bytes: int) -> None:
    """`good` rollouts in one row group, then `big` rows in another whose `env` is one value of `value_bytes`
    bytes: dictionary-encoded, it is written once (the file stays small) and a dense read holds it `big` times."""
    records = list(synthesize("shop", good + big, 2, 0))
    table = _to_arrow(records)
    env = pa.field("env", pa.dictionary(pa.int32(), pa.string()))
    schema = table.schema.set(table.schema.get_field_index("env"), env)
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        writer.write_table(table.slice(0, good).cast(schema))
        value = pa.array(["x" * value_bytes])
        column = pa.DictionaryArray.from_arrays(pa.array([0] * big, pa.int32()), value)
        bad = table.slice(good, big)
        writer.write_table(bad.set_column(bad.schema.get_field_index("env"), env, column).cast(schema))
    assert path.stat().st_size < 1 * MIB


def test_parquet_rows_over_the_record_limit_are_rejects_before_they_are_converted(tmp_path):
    parquet_store(tmp_path / "store.parquet", 5, 3, MAX_LINE_BYTES + MIB)  # under the row-group limit: read, checked
    counts, rejects, rss = score(tmp_path, "store.parquet")
    assert counts["scored"] == 5 and counts["rejected"] == 3
    assert sorted(r["location"] for r in rejects) == ["row 5", "row 6", "row 7"]
    assert all("is over the limit of 67,108,864 bytes (max_line_bytes)" in r["reason"] for r in rejects)
    assert rss < RSS_CEILING_MIB


@pytest.mark.fuzz
def test_a_small_parquet_store_of_3_rows_over_the_row_group_limit_is_3_rejects(tmp_path):
    parquet_store(tmp_path / "store.parquet", 5, 3, MAX_ROW_GROUP_BYTES)  # the row group is over its limit: unread
    counts, rejects, rss = score(tmp_path, "store.parquet")
    assert counts["scored"] == 5 and counts["rejected"] == 3
    assert all("(max_row_group_bytes): its rows are not read" in r["reason"] for r in rejects)
    assert rss < RSS_CEILING_MIB


def test_a_parquet_row_group_limit_is_set_by_an_option(tmp_path):
    parquet_store(tmp_path / "store.parquet", 5, 2, 4 * MIB)
    args = ("--format", "canonical", "--option", f"max_row_group_bytes={3 * MIB}")
    counts, rejects, _ = score(tmp_path, "store.parquet", *args)
    assert counts["scored"] == 5 and counts["rejected"] == 2
    assert [r["location"] for r in rejects] == ["row 5", "row 6"]


# -- JSON Lines -------------------------------------------------------------------------------------------


def empty_objects_line(mib: int) -> bytes:
    """One line of `mib` MiB that is a list of empty objects: a few KiB compressed, ~15 Python objects per byte
    decoded."""
    piece = b"{}," * (MIB // 3)
    return b"[" + piece * mib + b"{}]\n"


@pytest.mark.parametrize("mib", [8, pytest.param(60, marks=pytest.mark.fuzz)])
def test_a_line_of_many_objects_is_a_reject_before_it_is_decoded(tmp_path, mib):
    records = [json.dumps(r).encode() + b"\n" for r in synthesize("shop", 4, 2, 0)]
    c = zstandard.ZstdCompressor()
    data = c.compress(b"".join(records[:2]) + empty_objects_line(mib) + b"".join(records[2:]))
    (tmp_path / "store.jsonl.zst").write_bytes(data)
    counts, [reject], rss = score(tmp_path, "store.jsonl.zst")
    assert counts["scored"] == 4 and reject["location"] == "line 3"
    assert "objects and lists is over the limit of 1,000,000 (max_record_items)" in reject["reason"]
    assert rss < RSS_CEILING_MIB


# -- OTel: spans of one conversation ----------------------------------------------------------------------


def otel_logs(folder: Path, spans: int) -> None:
    """Two conversations as OTLP JSON Lines (zstd): `conv-9` of a chat span and `spans` tool spans in exports of
    1,000, and `conv-2` as the tests of the format write it."""
    from test_ingest_otel import CHAT, export, span, tool

    folder.mkdir()
    with (folder / "spans.jsonl.zst").open("wb") as f, zstandard.ZstdCompressor().stream_writer(f) as w:
        w.write(orjson.dumps(export(span("a" * 32, "b" * 16, "chat", 0, **CHAT))) + b"\n")
        for first in range(0, spans, 1000):
            batch = [
                tool("a" * 32, f"{i:016x}", 10 + i, "find_customer", f"c{i}")
                for i in range(first, min(spans, first + 1000))
            ]
            w.write(orjson.dumps(export(*batch)) + b"\n")
        other = {**CHAT, "gen_ai__conversation__id": "conv-2"}
        w.write(
            orjson.dumps(
                export(
                    span("c" * 32, "d" * 16, "chat", 0, **other), tool("c" * 32, "e" * 16, 10, "find_customer", "c1")
                )
            )
            + b"\n"
        )


@pytest.mark.parametrize(
    ("spans", "limit"), [(1_500, 1_000), pytest.param(1_000_000, None, marks=pytest.mark.fuzz)], ids=["small", "1M"]
)
def test_a_conversation_of_too_many_spans_is_one_reject(tmp_path, spans, limit):
    otel_logs(tmp_path / "logs", spans)
    extra = () if limit is None else ("--option", f"max_conversation_items={limit}")
    counts, [reject], rss = score(tmp_path, "logs", "--format", "otel", "--spec", "support", *extra)
    assert counts["scored"] == 1 and counts["rejected"] == 1
    assert reject["location"] == "key conv-9" and "(max_conversation_items)" in reject["reason"]
    assert f"more than {limit or 100_000:,} items" in reject["reason"]
    assert rss < OTEL_RSS_CEILING_MIB


# -- OTLP protobuf: spans of one message ------------------------------------------------------------------


def minimal_spans(copies: int, per_copy: int = 10_000) -> bytes:
    """An export request of `copies` × `per_copy` minimal spans (ids only), as the protobuf writer lays it out:
    serialized messages concatenated are the message with their repeated fields joined."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(per_copy):
        span = scope.spans.add()
        span.trace_id, span.span_id = b"\x01" * 16, i.to_bytes(8, "big")
    return request.SerializeToString() * copies


@pytest.mark.parametrize("copies", [1, 3, 7])
def test_spans_are_counted_from_the_framing_as_the_parser_reads_them(copies):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from pipeline.ingest.otlp import _items_over

    data = minimal_spans(copies, 1_000)
    parsed = sum(len(s.spans) for r in ExportTraceServiceRequest.FromString(data).resource_spans for s in r.scope_spans)
    assert _items_over(data, parsed) is None and _items_over(data, parsed - 1) == parsed


@pytest.mark.parametrize("copies", [5, pytest.param(220, marks=pytest.mark.fuzz)], ids=["50k", "2.2M"])
def test_a_protobuf_message_of_too_many_spans_is_one_reject(tmp_path, monkeypatch, copies):
    from test_ingest_otel import CHAT, export, span, tool

    from pipeline.ingest import otlp

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "big.binpb").write_bytes(minimal_spans(copies))
    good = export(span("c" * 32, "d" * 16, "chat", 0, **CHAT), tool("c" * 32, "e" * 16, 10, "find_customer", "c1"))
    (logs / "good.json").write_bytes(orjson.dumps(good))
    if copies < 100:  # the default limit needs 2 million spans: the small version lowers it in this process
        monkeypatch.setattr(otlp, "MAX_MESSAGE_ITEMS", 40_000)

        items = list(otlp.records(str(logs / "big.binpb")))
        assert [type(i).__name__ for i in items] == ["Malformed"]
        assert items[0].reason == "more than 40,000 spans or log records in one message, over the limit of 40,000"
        return
    counts, rejects, rss = score(tmp_path, "logs", "--format", "otel", "--spec", "support")
    assert counts["scored"] == 1 and len(rejects) == 1 and rejects[0]["location"].endswith("big.binpb")
    assert "over the limit of 1,000,000" in rejects[0]["reason"]
    assert rss < RSS_CEILING_MIB


# -- Inspect .eval archives: decompression per archive -----------------------------------------------------


def shared_data_archive(path: Path, source: Path, entries: int) -> None:
    """The samples of a real `.eval`, then `entries` directory entries over one zstd member's compressed bytes
    (1 GiB of zeros declared): a 61 KB archive whose entries each decompress the same data."""
    import struct
    import zipfile

    from test_read_bounds import GIB, write_zip, zero_crc, zstd_bomb

    from pipeline.ingest.inspect import _member

    with open(source, "rb") as f, zipfile.ZipFile(f) as z:
        members = [(n, 0, z.getinfo(n).CRC, data, len(data)) for n in z.namelist()
                   if isinstance(data := _member(f, z, n, GIB), bytes)]  # fmt: skip
    write_zip(path, members)
    method, data = zstd_bomb()
    data = data[: len(data) // 16]  # 64 MiB of zeros as zstd frames
    archive = path.read_bytes()
    directory_at = struct.unpack("<I", archive[-6:-2])[0]
    body, central = bytearray(archive[:directory_at]), bytearray(archive[directory_at:-22])
    offset = len(body)
    name = b"samples/shared_epoch_1.json"
    body += struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, zero_crc(GIB), len(data), GIB, len(name), 0
    )
    body += name + data
    for i in range(entries):
        entry = f"samples/shared{i}_epoch_1.json".encode()
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0, zero_crc(GIB), len(data),
                               GIB, len(entry), 0, 0, 0, 0, 0, offset) + entry  # fmt: skip
    count = len(members) + entries
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(central), len(body), 0)
    path.write_bytes(bytes(body + central + end))


@pytest.mark.fuzz  # about 100 s of wall time: `make test` and `make fuzz` run it, `make check` does not
def test_entries_over_shared_compressed_data_are_rejects_not_decompressed_again(tmp_path, eval_log):  # noqa: F811
    import resource

    (tmp_path / "logs").mkdir()
    shared_data_archive(tmp_path / "logs" / "night.eval", eval_log, 400)
    assert (tmp_path / "logs" / "night.eval").stat().st_size < 256 << 10
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    counts, rejects, rss = score(tmp_path, "logs", "--format", "inspect", "--env", "observed", "--spec", "support")
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
    print(f"400 shared entries: {cpu:.1f} s of CPU")
    assert counts["scored"] == 2 and counts["rejected"] == 400
    overlaps = [r for r in rejects if "a zip bomb's overlap" in r["reason"]]
    assert len(overlaps) == 399  # the first entry is read once: over max_member_bytes
    assert cpu < 60  # the whole command; the 400 entries decompressed again took 183 s
    assert rss < RSS_CEILING_MIB


def test_an_archive_is_decompressed_within_its_budget(tmp_path, eval_log):  # noqa: F811
    import zipfile

    (tmp_path / "logs").mkdir()
    path = tmp_path / "logs" / "night.eval"
    path.write_bytes(eval_log.read_bytes())
    with zipfile.ZipFile(path) as z:
        sizes = sorted(z.getinfo(n).file_size for n in z.namelist() if n.startswith("samples/"))
    args = (
        "--format",
        "inspect",
        "--env",
        "observed",
        "--spec",
        "support",
        "--option",
        f"max_archive_bytes={sizes[0]}",
    )
    counts, [reject], _ = score(tmp_path, "logs", *args)
    assert counts["scored"] == 1 and "(max_archive_bytes): not read" in reject["reason"]


def test_a_span_that_cannot_be_staged_makes_its_whole_conversation_one_reject(tmp_path):
    """A span nested past what JSON text can hold (orjson writes 255 levels) is not staged for the shuffle: its
    conversation is one reject, never scored from its other spans, and the other conversation is scored."""
    from test_ingest_otel import CHAT, export, span, tool

    deep: dict = {"stringValue": "bottom"}
    for _ in range(300):  # three JSON levels each in the file, one in the span as read
        deep = {"arrayValue": {"values": [deep]}}
    broken = tool("a" * 32, "b" * 16, 10, "find_customer", "c1")
    broken["attributes"].append({"key": "tool.detail", "value": deep})
    other = {**CHAT, "gen_ai__conversation__id": "conv-2"}
    docs = [
        export(span("a" * 32, "c" * 16, "chat", 0, **CHAT), broken),
        export(span("d" * 32, "e" * 16, "chat", 0, **other), tool("d" * 32, "f" * 16, 10, "find_customer", "c1")),
    ]
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "spans.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))  # orjson cannot
    counts, [reject], _ = score(tmp_path, "logs", "--format", "otel", "--spec", "support")
    assert counts["scored"] == 1 and counts["rejected"] == 1, counts
    assert reject["location"] == "key conv-9", reject
    assert f"an item of key {'a' * 32} cannot be written as JSON" in reject["reason"], reject  # its trace
    scored = pq.read_table(tmp_path / "run" / "rollouts", columns=["rollout_id"]).to_pylist()
    assert [r["rollout_id"] for r in scored] == ["conv-2"], scored


# -- text a rollout's steps repeat ---------------------------------------------------------------------------------


def long_attribute_logs(tmp: Path, per_rollout: list[tuple[int, int]]) -> Path:
    """OpenAI logs whose conversation i repeats its calls `rounds` times and carries a `note` of `chars`
    characters, for each (rounds, chars) of `per_rollout`; the `note` is read as an attribute."""
    from pipeline.synthetic.support_logs import write_samples

    [path] = write_samples(tmp / "logs", ("2026-11-27",), len(per_rollout), 2)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for line, (rounds, chars) in zip(lines, per_rollout, strict=True):
        line["messages"] = line["messages"][:2] + line["messages"][2:] * rounds
        line["note"] = "n" * chars
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return tmp / "logs"


def test_a_long_attribute_repeated_on_every_step_is_a_reject_before_it_takes_memory(tmp_path):
    """A 10 MB attribute on a rollout of 240 calls: its steps would hold it 240 times (3.4 GB, then an Arrow
    overflow made it a reject anyway). It is a reject at once, saying why; the other rollouts are scored."""
    from pipeline.core.records import MAX_REPEATED_CHARS

    long_attribute_logs(tmp_path, [(40, 10_000_000), (1, 10), (1, 10)])
    counts, [reject], rss = score(tmp_path, "logs", "--format", "openai", "--option", "attr.note=note")
    assert counts["scored"] == 2 and counts["rejected"] == 1, counts
    assert reject["location"] == "line 1"
    said = f"each of its 240 calls make 2,400,015,360 characters of steps, over the limit of {MAX_REPEATED_CHARS:,}"
    assert said in reject["reason"], reject
    assert rss < RSS_CEILING_MIB, rss


def test_rollouts_whose_steps_repeat_much_text_are_converted_a_few_at_a_time(tmp_path):
    """40 rollouts of 18 calls, each with a 1 MB attribute: each is within the limit, and the batch is converted
    before their repeated text passes it together (one batch of 40 held 720 MB of steps text: 830 MiB peak)."""
    long_attribute_logs(tmp_path, [(3, 1_000_000)] * 40)
    counts, rejects, rss = score(tmp_path, "logs", "--format", "openai", "--option", "attr.note=note")
    assert counts["scored"] == 40 and not rejects, (counts, rejects)
    assert rss < RSS_CEILING_MIB, rss


def test_the_guard_refuses_the_call_that_takes_a_session_past_the_repeated_text_limit_with_the_scorers_reason(
    tmp_path,
):
    """The scorer rejects a rollout whose steps would repeat more than MAX_REPEATED_CHARS; a live session with the
    same labels is refused the call that would make it such a rollout, for the same reason."""
    from pipeline.apps.guard.session import open_session
    from pipeline.core.errors import InvalidRecord
    from pipeline.core.model import Call
    from pipeline.core.records import MAX_ID_CHARS, MAX_LABELS, MAX_REPEATED_CHARS

    labels = {f"l{i}": "v" * MAX_ID_CHARS for i in range(MAX_LABELS)}  # every label at its longest
    own = MAX_LABELS * MAX_ID_CHARS + len("guard") * 2 + len("observed")
    allowed = MAX_REPEATED_CHARS // own  # 127 calls
    session = open_session("observed", labels=labels)
    try:
        for _ in range(allowed):
            session.record(Call("lookup", {"q": "x"}), output="ok")
        said = f"({own:,} characters) on each of its {allowed + 1:,} calls make {own * (allowed + 1):,} characters"
        with pytest.raises(InvalidRecord, match=said.replace("(", r"\(").replace(")", r"\)")):
            session.check(Call("lookup", {"q": "x"}))
        with pytest.raises(InvalidRecord, match="over the limit"):
            session.record(Call("lookup", {"q": "x"}), output="ok")
        assert session.depth == allowed
        call = {"type": "call", "tool": "lookup", "arguments": {"q": "x"}, "output": "ok"}
        record = {"rollout_id": "guard", "task_id": "guard", "benchmark": "observed", "labels": labels,
                  "events": [call] * (allowed + 1)}  # fmt: skip
    finally:
        session.close()
    (tmp_path / "store.jsonl").write_bytes(orjson.dumps(record) + b"\n")
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings

    run_scoring(str(tmp_path / "store.jsonl"), str(tmp_path / "run"), ScoreSettings(inline=True, env="observed"))
    counts = json.loads((tmp_path / "run" / "_manifest.json").read_text())["counts"]
    assert (counts["scored"], counts["rejected"]) == (0, 1), counts
    [reject] = pq.read_table(tmp_path / "run" / "rejects").to_pylist()
    assert said in reject["reason"]


def test_a_member_with_a_long_name_is_a_reject_whose_location_is_clipped(tmp_path, eval_log):  # noqa: F811
    """A zip member's name may have 65,535 characters: its reject's location keeps 1,000 and counts the rest."""
    from test_read_bounds import GIB, write_zip

    from pipeline.ingest.inspect import _member

    with open(eval_log, "rb") as f, zipfile.ZipFile(f) as z:
        members = [(n, 0, z.getinfo(n).CRC, data, len(data)) for n in z.namelist()
                   if isinstance(data := _member(f, z, n, GIB), bytes)]  # fmt: skip
    name = "samples/" + "x" * 60_000 + "_epoch_1.json"
    members.append((name, 0, zlib.crc32(b"not json"), b"not json", 8))
    (tmp_path / "logs").mkdir()
    write_zip(tmp_path / "logs" / "night.eval", members)
    counts, [reject], _ = score(tmp_path, "logs", "--format", "inspect", "--env", "observed", "--spec", "support")
    assert counts["scored"] == 2 and counts["rejected"] == 1
    assert reject["location"] == name[:1000] + f"… ({len(name) - 1000:,} more characters)"
