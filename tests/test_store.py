from __future__ import annotations

import gzip
import io
import os
import re
import uuid
import zlib
from pathlib import Path
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import examples
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import StoreError
from pipeline.storage.inputs import (
    line_shards,
    list_inputs,
    plan_shards,
    read_shard,
    shard_lines,
    stream_batches,
    supplied,
)
from pipeline.storage.shards import InputFile, RecordError, Shard


def jsonl(*records: Any) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def read_all(shards: list[Shard], **kw: Any) -> list[tuple[str, Any]]:
    return [item for shard in shards for item in read_shard(shard, **kw)]


def read_url(url: str, target_bytes: int = 64 * 2**20) -> list[tuple[str, Any]]:
    files, _ = list_inputs(url)
    return read_all(plan_shards(files, target_bytes))


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- listing -------------------------------------------------------------------------------------------


def test_lists_nested_data_files_sorted_and_reports_other_extensions(tmp_path: Path) -> None:
    for name in [
        "b/deep/x.parquet", "a.jsonl", "b/c.jsonl.gz", "b/d.ndjson.zst", "e.json", "F.JSONL",
        "notes.txt", "b/data.csv",
        "_manifest.json", ".hidden.jsonl", "_tmp/part.jsonl", ".git/objects/y.jsonl", "b/_SUCCESS",
    ]:  # fmt: skip
        write(tmp_path / name, b"{}\n")

    files, ignored = list_inputs(str(tmp_path))

    root = str(tmp_path)
    assert [(f.url, f.fmt, f.compression, f.size) for f in files] == [
        (f"{root}/F.JSONL", "jsonl", None, 3),
        (f"{root}/a.jsonl", "jsonl", None, 3),
        (f"{root}/b/c.jsonl.gz", "jsonl", "gzip", 3),
        (f"{root}/b/d.ndjson.zst", "jsonl", "zstd", 3),
        (f"{root}/b/deep/x.parquet", "parquet", None, 3),
        (f"{root}/e.json", "jsonl", None, 3),
    ]
    assert ignored == [f"{root}/b/data.csv", f"{root}/notes.txt"]
    assert list_inputs(str(tmp_path)) == (files, ignored)


def test_store_under_an_underscore_folder_is_listed(tmp_path: Path) -> None:
    # The hidden-name rule applies below the store root, not to the folders leading to it.
    write(tmp_path / "_runs" / "a.jsonl", b"{}\n")
    files, _ = list_inputs(str(tmp_path / "_runs"))
    assert [f.url for f in files] == [f"{tmp_path}/_runs/a.jsonl"]


def test_single_file_and_file_url(tmp_path: Path) -> None:
    path = write(tmp_path / "one.jsonl", b'{"a": 1}\n')
    write(tmp_path / "other.jsonl", b'{"a": 2}\n')

    files, ignored = list_inputs(str(path))
    assert [f.url for f in files] == [str(path)]
    assert ignored == []
    assert list_inputs(f"file://{path}") == (files, ignored)
    assert list_inputs(f"file://{tmp_path}")[0][0].url == str(path)
    assert read_url(f"file://{path}") == [("line 1", {"a": 1})]


def test_memory_filesystem(mem_root: str) -> None:
    fs = fsspec.filesystem("memory")
    root = mem_root.removeprefix("memory://")
    fs.pipe(f"{root}/z/b.jsonl", jsonl({"b": 1}))
    fs.pipe(f"{root}/a.jsonl", jsonl({"a": 1}))
    fs.pipe(f"{root}/_manifest.json", b"{}")

    files, ignored = list_inputs(mem_root)

    assert [f.url for f in files] == [f"memory:///{root}/a.jsonl", f"memory:///{root}/z/b.jsonl"]
    assert ignored == []
    assert read_all(plan_shards(files)) == [("line 1", {"a": 1}), ("line 1", {"b": 1})]


def test_missing_store(tmp_path: Path) -> None:
    url = str(tmp_path / "nope")
    with pytest.raises(StoreError, match=f"^no such store: {url}$"):
        list_inputs(url)
    with pytest.raises(StoreError, match=rf"^{re.escape('no such store: memory://absent-store')}$"):
        list_inputs("memory://absent-store")


def test_empty_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"^no data files under {tmp_path}$"):
        list_inputs(str(tmp_path))
    write(tmp_path / "_manifest.json", b"{}")
    write(tmp_path / "readme.md", b"hi")
    with pytest.raises(StoreError, match=rf"^no data files under {tmp_path} \(1 other files ignored"):
        list_inputs(str(tmp_path))


def test_unknown_protocol() -> None:
    with pytest.raises(StoreError, match=rf"^{re.escape('cannot open store nosuchproto://x')}"):
        list_inputs("nosuchproto://x")


def test_fingerprint_follows_content_version(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", b"{}\n")
    os.utime(path, (1_000_000, 1_000_000))
    first = list_inputs(str(path))[0][0].fingerprint
    assert first.startswith("3-")
    assert list_inputs(str(path))[0][0].fingerprint == first
    os.utime(path, (2_000_000, 2_000_000))  # same size, new version
    second = list_inputs(str(path))[0][0].fingerprint
    assert second != first
    assert second.startswith("3-")


# --- byte-range sharding -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=5,
)
records = st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=4), json_values, max_size=3)
# A line of the file: a record, a JSON value that is not an object, or a blank line.
lines = st.one_of(
    records.map(lambda r: ("record", r)),
    st.sampled_from([[1], "s", 3, None]).map(lambda v: ("not_object", v)),
    st.sampled_from(["", " ", "\t ", "\r"]).map(lambda s: ("blank", s)),
)


@pytest.mark.fuzz
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    content=st.lists(st.tuples(lines, st.sampled_from(["\n", "\r\n"])), max_size=25),
    trailing_newline=st.booleans(),
    target_bytes=st.integers(1, 200),
)
def test_byte_ranges_return_every_record_once(
    content: list[tuple[tuple[str, Any], str]], trailing_newline: bool, target_bytes: int
) -> None:
    data = bytearray()
    expected: list[tuple[int, int, Any]] = []  # (byte offset, line number, record or error)
    for number, ((kind, value), newline) in enumerate(content, start=1):
        text = value.encode() if kind == "blank" else orjson.dumps(value)
        if kind == "record":
            expected.append((len(data), number, value))
        elif kind == "not_object":
            got_kind = "null" if value is None else type(value).__name__
            error = RecordError(f"record is not a JSON object (got {got_kind})", text.decode())
            expected.append((len(data), number, error))
        data += text + newline.encode()
    if content and not trailing_newline:
        del data[-len(content[-1][1]) :]
    url = "memory:///hypothesis/data.jsonl"
    MemoryFileSystem().pipe(url, bytes(data))

    files, _ = list_inputs(url)
    shards = plan_shards(files, target_bytes)

    assert files[0].size == len(data)
    if len(data) > target_bytes:
        assert [(s.start, s.stop) for s in shards] == [
            (start, min(start + target_bytes, len(data))) for start in range(0, len(data), target_bytes)
        ]
        got = []
        for shard in shards:
            assert shard.stop is not None
            part = list(read_shard(shard))
            offsets = [int(loc.removeprefix("byte ")) for loc, _ in part]
            assert all(shard.start <= o < shard.stop for o in offsets)
            got += part
        assert got == [(f"byte {offset}", record) for offset, _, record in expected]
    else:
        assert shards == [Shard(files[0], 0, None)]
        assert read_all(shards) == [(f"line {number}", record) for _, number, record in expected]


def test_line_starting_exactly_at_a_boundary(mem_root: str) -> None:
    fs = fsspec.filesystem("memory")
    data = b'{"a":1}\n{"b":2}\n\n{"c":3}'  # lines start at 0, 8, 16 (blank), 17
    fs.pipe(f"{mem_root}/f.jsonl", data)
    files, _ = list_inputs(f"{mem_root}/f.jsonl")
    shards = plan_shards(files, 4)
    assert [(s.start, s.stop) for s in shards] == [(0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 24)]
    assert [list(read_shard(s)) for s in shards] == [
        [("byte 0", {"a": 1})],
        [],
        [("byte 8", {"b": 2})],
        [],
        [("byte 17", {"c": 3})],
        [],
    ]


def test_byte_offsets_count_bytes_not_characters(mem_root: str) -> None:
    fs = fsspec.filesystem("memory")
    first = orjson.dumps({"s": "é😀"}) + b"\r\n"
    fs.pipe(f"{mem_root}/u.jsonl", first + b'{"n":2}\r\n')
    files, _ = list_inputs(mem_root)
    assert read_all(plan_shards(files, 4)) == [("byte 0", {"s": "é😀"}), (f"byte {len(first)}", {"n": 2})]


def test_utf8_bom_at_file_start_is_ignored(tmp_path: Path) -> None:
    write(tmp_path / "bom.jsonl", b'\xef\xbb\xbf{"a":1}\n{"b":2}\n')
    assert read_url(str(tmp_path)) == [("line 1", {"a": 1}), ("line 2", {"b": 2})]
    assert read_url(str(tmp_path), target_bytes=5) == [("byte 0", {"a": 1}), ("byte 11", {"b": 2})]


def test_file_changed_since_listing(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", jsonl({"a": 1}, {"a": 2}))
    shards = plan_shards(list_inputs(str(path))[0], 4)
    path.write_bytes(jsonl({"a": 1}))
    with pytest.raises(StoreError, match="changed since it was listed: size 16, now 8"):
        list(read_shard(shards[1]))


def test_target_bytes_must_be_positive(tmp_path: Path) -> None:
    files, _ = list_inputs(str(write(tmp_path / "a.jsonl", b"{}\n")))
    with pytest.raises(ValueError, match="target_bytes must be at least 1"):
        plan_shards(files, 0)


# --- bad records ---------------------------------------------------------------------------------------


def test_bad_lines_become_record_errors_and_reading_goes_on(tmp_path: Path) -> None:
    long_garbage = "x" * 5000
    write(
        tmp_path / "bad.jsonl",
        b'{"ok": 1}\n{"broken": \n[1, 2]\n"text"\n{"bad": "\xff\xfe"}\n' + long_garbage.encode() + b'\n{"ok": 2}\n',
    )
    out = read_url(str(tmp_path))

    assert [loc for loc, _ in out] == [f"line {n}" for n in range(1, 8)]
    assert out[0][1] == {"ok": 1}
    assert out[6][1] == {"ok": 2}
    errors = [rec for _, rec in out[1:6]]
    assert all(isinstance(e, RecordError) for e in errors)
    assert errors[0].reason.startswith("invalid JSON: ")
    assert errors[0].raw == '{"broken": '
    assert errors[1] == RecordError("record is not a JSON object (got list)", "[1, 2]")
    assert errors[2] == RecordError("record is not a JSON object (got str)", '"text"')
    assert errors[3].reason.startswith("invalid UTF-8: 'utf-8' codec can't decode byte 0xff in position 9")
    assert errors[3].raw == '{"bad": "\ufffd\ufffd"}'
    assert errors[4].reason.startswith("invalid JSON: ")
    assert errors[4].raw == "x" * 2000


def test_bad_lines_in_byte_ranges(tmp_path: Path) -> None:
    write(tmp_path / "bad.jsonl", b'{"ok": 1}\nnope\r\n{"ok": 2}\n')
    out = read_url(str(tmp_path), target_bytes=10)
    assert [loc for loc, _ in out] == ["byte 0", "byte 10", "byte 16"]
    assert out[1][1].reason.startswith("invalid JSON: ")
    assert out[1][1].raw == "nope"


# --- compressed JSONL ----------------------------------------------------------------------------------


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


RECORDS = [{"i": i, "text": f"r{i} ü"} for i in range(2000)]


@pytest.mark.parametrize(
    ("name", "compress"),
    [
        ("a.jsonl.gz", gzip.compress),
        ("a.jsonl.zst", zstd),
        # Two frames back to back, as `cat a.zst b.zst` makes.
        ("two.jsonl.zst", lambda d: zstd(d[:777]) + zstd(d[777:])),
        ("two.jsonl.gz", lambda d: gzip.compress(d[:777]) + gzip.compress(d[777:])),
    ],
)  # fmt: skip
def test_compressed_files_cut_by_decompressed_bytes_read_as_whole(tmp_path: Path, name: str, compress: Any) -> None:
    data = jsonl(*RECORDS)
    write(tmp_path / name, compress(data))
    files, _ = list_inputs(str(tmp_path))
    shards = plan_shards(files, target_bytes=1000)
    # ranges of the decompressed bytes, as a plain file's are of its bytes: the same keys on every plan
    assert [(s.start, s.stop) for s in shards] == [(a, min(a + 1000, len(data))) for a in range(0, len(data), 1000)]
    assert [s.key for s in shards] == [s.key for s in plan_shards(files, target_bytes=1000)]
    # named as a whole-file read names them, whether each range is read from the file or from one streaming pass
    expected = [(f"line {i + 1}", r) for i, r in enumerate(RECORDS)]
    assert read_all(shards) == expected
    streamed = []
    for batch, shard in zip(stream_batches(shards), shards, strict=True):
        with supplied(batch):
            streamed += read_shard(shard)
    assert streamed == expected
    assert plan_shards(files, target_bytes=len(data)) == [Shard(files[0], 0, None)]  # what fits one shard is whole


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_compressed_file_stays_one_shard_that_names_where_it_breaks(tmp_path: Path, damage: str) -> None:
    whole = gzip.compress(jsonl(*RECORDS))
    data = whole[: len(whole) // 2] if damage == "truncated" else whole[:-8] + bytes(8)  # CRC and size zeroed
    write(tmp_path / "d.jsonl.gz", data)
    files, _ = list_inputs(str(tmp_path))
    assert plan_shards(files, target_bytes=1000) == [Shard(files[0], 0, None)]
    out = read_all(plan_shards(files, target_bytes=1000))
    assert isinstance(out[-1][1], RecordError) and out[-1][1].reason.startswith(f"{damage} gzip stream ")
    assert len(out) == 1 if damage == "corrupt" else len(out) > 1  # a damaged member is lost whole


def test_a_range_of_a_file_changed_since_its_plan_is_a_storage_error(tmp_path: Path) -> None:
    path = write(tmp_path / "c.jsonl.gz", gzip.compress(jsonl(*RECORDS)))
    files, _ = list_inputs(str(tmp_path))
    shards = plan_shards(files, target_bytes=1000)
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # same size, another CRC
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="changed since it was planned"):
        read_all(shards)


_LINE = st.one_of(
    st.builds(lambda i, t: orjson.dumps({"i": i, "t": t}), st.integers(-(2**63), 2**63 - 1), st.text(max_size=30)),
    st.sampled_from([b"", b"  ", b"\r", b"not json", b"[1, 2]", b"\xef\xbb\xbf{}", b"\xff\xfe"]),
    st.integers(65, 200).map(lambda n: b'{"x": "' + b"y" * n + b'"}'),  # over the 64-byte line limit below
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(_LINE, max_size=60),
    newline=st.sampled_from([b"\n", b"\r\n"]),
    trailing=st.booleans(),
    codec=st.sampled_from(["gzip", "zstd"]),
    members=st.integers(1, 3),
    target=st.integers(1, 400),
    data=st.data(),
)
def test_ranges_of_a_compressed_file_hold_every_line_once_as_a_whole_file_read_names_it(
    tmp_path: Path,
    lines: list[bytes],
    newline: bytes,
    trailing: bool,
    codec: str,
    members: int,
    target: int,
    data: st.DataObject,
) -> None:
    """Whatever the target size, the lines, the line ends and the members: the ranges' lines, read from the file
    or handed on by one streaming pass, are the whole-file read's lines in order, each once, with its location
    ("line N"), a line over the limit a reject in its place, a BOM dropped only on the file's first line."""
    content = newline.join(lines) + (newline if trailing and lines else b"")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(content)), min_size=members - 1, max_size=members - 1)))
    pieces = [content[a:b] for a, b in zip([0, *cuts], [*cuts, len(content)], strict=True)]
    pack = gzip.compress if codec == "gzip" else zstandard.ZstdCompressor().compress
    path = tmp_path / f"{uuid.uuid4().hex}.jsonl.{'gz' if codec == 'gzip' else 'zst'}"
    write(path, b"".join(pack(p) for p in pieces))
    files, _ = list_inputs(str(path))
    whole = list(shard_lines(Shard(files[0], 0, None), max_line=64))

    shards = line_shards(files, target)
    assert [s.key for s in shards] == [s.key for s in line_shards(files, target)]  # a rerun plans the same shards
    assert [item for s in shards for item in shard_lines(s, max_line=64)] == whole
    ranges = [s for s in shards if not s.whole_file]
    streamed = []
    for batch, shard in zip(stream_batches(ranges, max_line=64), ranges, strict=True):
        assert batch.shard == shard.key
        with supplied(batch):
            streamed += shard_lines(shard, max_line=64)
    assert streamed == (whole if ranges else [])


def test_truncated_gzip_yields_good_records_then_one_error(tmp_path: Path) -> None:
    whole = gzip.compress(jsonl(*RECORDS))
    cut = whole[: len(whole) // 2]
    readable = zlib.decompressobj(wbits=31).decompress(cut)
    good = readable.count(b"\n")
    assert 0 < good < len(RECORDS)
    write(tmp_path / "t.jsonl.gz", cut)

    out = read_url(str(tmp_path))

    assert out[:-1] == [(f"line {i + 1}", r) for i, r in enumerate(RECORDS[:good])]
    loc, err = out[-1]
    assert loc == f"line {good + 1}"
    assert isinstance(err, RecordError)
    assert err.reason == (
        f"truncated gzip stream after line {good}: the file ends ({len(cut)} bytes) inside the member starting at "
        "compressed byte 0"
    )
    assert err.raw == readable[readable.rindex(b"\n") + 1 :].decode("utf-8", "replace")


def test_truncated_zstd_yields_good_records_then_one_error(tmp_path: Path) -> None:
    many = [{"i": i, "text": f"record {i}"} for i in range(50_000)]  # several zstd blocks
    data = jsonl(*many)
    whole = zstandard.ZstdCompressor().compress(data)
    cut = whole[: len(whole) // 2]
    write(tmp_path / "t.jsonl.zst", cut)

    out = read_url(str(tmp_path))

    # Whole blocks decode: a prefix of the records, then the error once, holding the partial line.
    good = len(out) - 1
    assert 0 < good < len(many)
    assert out[:-1] == [(f"line {i + 1}", r) for i, r in enumerate(many[:good])]
    loc, err = out[-1]
    assert loc == f"line {good + 1}"
    assert err.reason == (
        f"truncated zstd stream after line {good}: the file ends ({len(cut)} bytes) inside the frame starting at "
        "compressed byte 0"
    )
    assert data[len(jsonl(*many[:good])) :].decode().startswith(err.raw)
    assert "\n" not in err.raw


@pytest.mark.parametrize(
    ("name", "compress"),
    [
        ("m.jsonl.gz", gzip.compress),
        ("m.jsonl.zst", zstandard.ZstdCompressor(write_checksum=True).compress),  # the zstd CLI's default
    ],
)
def test_a_damaged_member_is_lost_whole_and_the_members_before_it_are_kept(
    tmp_path: Path, name: str, compress: Any
) -> None:
    """Damage inside a gzip member can decode into well-formed but wrong lines before the CRC at the member's
    end fails (measured: 64 zeroed bytes mid-member gave thousands of such lines), so the whole member goes;
    the intact members before it (`cat a.gz b.gz`, pigz, bgzip) are read."""
    many = [{"i": i, "text": f"record {i} " + "x" * (i % 97)} for i in range(30_000)]
    members = [compress(jsonl(*many[k : k + 10_000])) for k in range(0, 30_000, 10_000)]
    second = bytearray(members[1])
    middle = len(second) // 2
    second[middle : middle + 64] = bytes(64)
    data = members[0] + bytes(second) + members[2]
    write(tmp_path / name, data)

    out = read_url(str(tmp_path))

    assert out[:-1] == [(f"line {i + 1}", r) for i, r in enumerate(many[:10_000])]
    loc, err = out[-1]
    kind, member = ("gzip", "member") if name.endswith(".gz") else ("zstd", "frame")
    assert loc == "line 10001" and err.raw == ""
    assert err.reason.startswith(
        f"corrupt {kind} stream after line 10000: the {member} starting at compressed byte {len(members[0])} is "
        "damaged ("
    )
    assert err.reason.endswith(
        f"): it and the rest of the file (compressed bytes {len(members[0])}-{len(data)}) are lost"
    )


def test_corrupt_compressed_headers(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl.gz", b"not gzip at all")
    write(tmp_path / "b.jsonl.zst", b"not zstd at all")
    out = read_url(str(tmp_path))
    assert [loc for loc, _ in out] == ["line 1", "line 1"]
    assert out[0][1] == RecordError(
        "corrupt gzip stream at the start: the member starting at compressed byte 0 is damaged (Error -3 while "
        "decompressing data: incorrect header check): it and the rest of the file (compressed bytes 0-15) are lost",
        "",
    )
    assert out[1][1].reason.startswith(
        "corrupt zstd stream at the start: the frame starting at compressed byte 0 is damaged (zstd decompressor error"
    )


def test_empty_files_have_no_records(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", b"")
    write(tmp_path / "b.jsonl.gz", gzip.compress(b""))
    write(tmp_path / "c.jsonl.zst", zstandard.ZstdCompressor().compress(b""))
    write(tmp_path / "d.jsonl", b"\n \n")
    assert read_url(str(tmp_path), target_bytes=1) == []


# --- Parquet -------------------------------------------------------------------------------------------


def parquet_bytes(table: pa.Table, **kw: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kw)
    return buf.getvalue()


NESTED = pa.table(
    {
        "rollout_id": [f"r{i}" for i in range(1000)],
        "events": [[{"type": "call", "tool": f"t{i}", "turn": i % 3}] for i in range(1000)],
        "labels": pa.array([[("model", f"m{i % 4}")] for i in range(1000)], pa.map_(pa.string(), pa.string())),
        "cost": [{"tokens": i, "latency_s": i / 2} for i in range(1000)],
    }
)
NESTED_ROWS = [
    {
        "rollout_id": f"r{i}",
        "events": [{"type": "call", "tool": f"t{i}", "turn": i % 3}],
        "labels": {"model": f"m{i % 4}"},
        "cost": {"tokens": i, "latency_s": i / 2},
    }
    for i in range(1000)
]


def test_parquet_splits_by_row_group_and_rows_come_back_once(tmp_path: Path) -> None:
    write(tmp_path / "p.parquet", parquet_bytes(NESTED, row_group_size=100))
    files, _ = list_inputs(str(tmp_path))
    meta = pq.read_metadata(tmp_path / "p.parquet")
    rg_bytes = [
        sum(meta.row_group(i).column(c).total_compressed_size for c in range(meta.num_columns))
        for i in range(meta.num_row_groups)
    ]
    assert meta.num_row_groups == 10

    # Target between one and two row groups: every shard closes at the row group that reaches it.
    shards = plan_shards(files, target_bytes=max(rg_bytes) + 1)
    assert [(s.start, s.stop) for s in shards] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    out = read_all(shards)
    assert out == [(f"row {i}", row) for i, row in enumerate(NESTED_ROWS)]

    one_per_group = plan_shards(files, target_bytes=1)
    assert [(s.start, s.stop) for s in one_per_group] == [(i, i + 1) for i in range(10)]
    assert read_all(one_per_group) == out

    assert plan_shards(files, target_bytes=sum(rg_bytes)) == [Shard(files[0], 0, None)]
    assert read_all(plan_shards(files)) == out


def test_parquet_with_one_row_group_is_one_shard(tmp_path: Path) -> None:
    write(tmp_path / "p.parquet", parquet_bytes(NESTED.slice(0, 10)))
    files, _ = list_inputs(str(tmp_path))
    shards = plan_shards(files, target_bytes=1)
    assert shards == [Shard(files[0], 0, None)]
    assert read_all(shards) == [(f"row {i}", row) for i, row in enumerate(NESTED_ROWS[:10])]


def test_unreadable_parquet_is_one_reject(tmp_path: Path) -> None:
    write(tmp_path / "p.parquet", b"this is not parquet")
    files, _ = list_inputs(str(tmp_path))
    shards = plan_shards(files, target_bytes=1)
    assert shards == [Shard(files[0], 0, None)]
    [(loc, err)] = read_all(shards)
    assert loc == "row group 0"
    assert isinstance(err, RecordError)
    assert err.reason.startswith("unreadable Parquet at row group 0: Parquet magic bytes not found")


def test_corrupt_parquet_row_group_keeps_earlier_rows(tmp_path: Path) -> None:
    data = bytearray(parquet_bytes(NESTED, row_group_size=100))
    meta = pq.read_metadata(io.BytesIO(bytes(data)))
    page = meta.row_group(3).column(0).data_page_offset
    data[page : page + 16] = b"\xff" * 16  # the page header of row group 3
    write(tmp_path / "p.parquet", bytes(data))
    files, _ = list_inputs(str(tmp_path))

    out = read_all(plan_shards(files))

    assert out[:-1] == [(f"row {i}", row) for i, row in enumerate(NESTED_ROWS[:300])]
    loc, err = out[-1]
    assert loc == "row 300"
    assert isinstance(err, RecordError)
    assert err.reason.startswith("unreadable Parquet at row 300: ")


def test_parquet_duplicate_map_key_rejects_only_that_row(tmp_path: Path) -> None:
    table = pa.table(
        {"labels": pa.array([[("m", "a")], [("m", "a"), ("m", "b")], [("m", "c")]], pa.map_(pa.string(), pa.string()))}
    )
    write(tmp_path / "p.parquet", parquet_bytes(table))
    out = read_url(str(tmp_path))
    assert out[0] == ("row 0", {"labels": {"m": "a"}})
    assert out[2] == ("row 2", {"labels": {"m": "c"}})
    loc, err = out[1]
    assert loc == "row 1"
    assert err.reason.startswith("Parquet row not convertible: Converting to Python dictionary is not supported")
    assert err.raw == "{'labels': [('m', 'a'), ('m', 'b')]}"


# --- storage failures propagate ------------------------------------------------------------------------


class _FailingFile(io.BytesIO):
    reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise ConnectionError("storage went away")
        return super().read(size)


class FlakyFileSystem(MemoryFileSystem):
    """Serves memory files whose second read fails, like a dropped connection."""

    protocol = "flakytest"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("flakytest://"))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return _FailingFile(self.cat_file(path))


@pytest.mark.parametrize(
    ("fmt", "compression", "data"),
    [
        ("jsonl", "gzip", gzip.compress(jsonl(*RECORDS))),
        ("jsonl", "zstd", zstandard.ZstdCompressor().compress(jsonl(*RECORDS))),
        ("parquet", None, parquet_bytes(NESTED, row_group_size=100)),
    ],
)
def test_storage_errors_are_raised_not_rejected(fmt: Any, compression: Any, data: bytes) -> None:
    fsspec.register_implementation("flakytest", FlakyFileSystem, clobber=True)
    path = f"/flaky-{uuid.uuid4().hex}"
    MemoryFileSystem().pipe(path, data)
    file = InputFile(f"flakytest://{path}", fmt, compression, size=len(data), fingerprint="x")
    try:
        with pytest.raises(ConnectionError, match="storage went away"):
            list(read_shard(Shard(file, 0, None)))
    finally:
        MemoryFileSystem().rm(path)


# --- shard keys ----------------------------------------------------------------------------------------


def test_shard_keys_are_stable_and_distinct(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", jsonl(*RECORDS[:50]))
    write(tmp_path / "b.jsonl", jsonl(*RECORDS[:50]))
    files, _ = list_inputs(str(tmp_path))
    shards = plan_shards(files, 200)
    again = plan_shards(list_inputs(str(tmp_path))[0], 200)

    assert [s.key for s in shards] == [s.key for s in again]
    assert len({s.key for s in shards}) == len(shards) > 2
    assert all(len(s.key) == 16 and int(s.key, 16) >= 0 for s in shards)
    whole = plan_shards(files)
    assert whole[0].whole_file and not shards[0].whole_file
    assert whole[0].key not in {s.key for s in shards}
    # The same range of another file, and the same file under another range, get other keys.
    assert Shard(files[0], 0, 200).key != Shard(files[1], 0, 200).key
    assert Shard(files[0], 0, 200).key != Shard(files[0], 0, 201).key
