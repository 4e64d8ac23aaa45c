"""Reading is streaming and bounded: a gzip bomb, a zstd bomb, an Inspect `.eval` zip bomb (a deflate and a zstd
member) and a 1 GiB line (in a small compressed file) each cost a scoring process less than `RSS_CEILING_MIB`,
the oversized part is one counted reject with its location, and every other record is scored. Malformed raw
records are rejects (`score --format`) or one-line errors (`ingest`), never tracebacks."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard
from test_producers_inspect import eval_log  # noqa: F401  (a fixture: a real .eval written by inspect_ai)
from typer.testing import CliRunner

from pipeline.apps.cli.app import app
from pipeline.core.errors import IngestError
from pipeline.ingest.bfcl import is_error_output, read_scores
from pipeline.ingest.inspect import _member
from pipeline.synthetic.support_logs import write_samples

RSS_CEILING_MIB = 450  # a scoring process (`--inline`) reading any of these bombs; the default line limit is 64 MiB
GIB = 1 << 30
_MIB_OF = {b: b * (1 << 20) for b in (b"a", b"\0")}


def pexec_rss(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run `pexec ARGS`; its result and its peak RSS in MiB (GNU time's maximum resident set size)."""
    script = str(Path(sys.executable).with_name("pexec"))
    proc = subprocess.run(["/usr/bin/time", "-f", "RSS %M", script, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    rss = int(proc.stderr.strip().splitlines()[-1].removeprefix("RSS "))
    return proc, rss / 1024


def conversations(tmp: Path, n: int) -> list[bytes]:
    [path] = write_samples(tmp / "samples", ("2026-11-27",), n, 7)
    return path.read_bytes().splitlines(keepends=True)


def gzip_bomb_line(mib: int = 256) -> bytes:
    """`mib` MiB of one line as gzip members of 1 MiB each (a few hundred KiB on disk; inflating is what takes
    time here, so gzip's bomb is 4 times the line limit, zstd's 1 GiB)."""
    return gzip.compress(_MIB_OF[b"a"]) * mib


def zstd_bomb_line(mib: int = 1024) -> bytes:
    return zstandard.ZstdCompressor().compress(_MIB_OF[b"a"]) * mib


def score_bombed(tmp: Path, name: str, head: bytes, bomb: bytes, tail: bytes, fmt: str = "openai") -> dict:
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    (logs / name).write_bytes(head + bomb + tail)
    assert (logs / name).stat().st_size < 8 << 20
    args = ["score", "logs", "--out", "run", "--inline", "--spec", "support"]
    if fmt != "canonical":
        args += ["--format", fmt, "--option", "error_prefix=Error:"]
    proc, rss = pexec_rss(*args, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert rss < RSS_CEILING_MIB, f"peak RSS {rss:.0f} MiB"
    print(f"{name}: peak RSS {rss:.0f} MiB")
    manifest = json.loads((tmp / "run" / "_manifest.json").read_text())
    [reject] = pq.read_table(tmp / "run" / "rejects").to_pylist()
    return {"counts": manifest["counts"], "reject": reject}


@pytest.mark.parametrize(("suffix", "compress"), [(".gz", gzip.compress), (".zst", zstandard.compress)])
def test_a_compressed_bomb_line_is_one_reject_and_the_other_conversations_are_scored(tmp_path, suffix, compress):
    good = conversations(tmp_path, 6)
    bomb = gzip_bomb_line() if suffix == ".gz" else zstd_bomb_line()
    got = score_bombed(tmp_path, f"night.jsonl{suffix}", compress(b"".join(good[:3])), bomb,
                       compress(b"\n" + b"".join(good[3:])))  # fmt: skip
    assert got["counts"]["scored"] == 6 and got["counts"]["rejected"] == 1
    assert got["reject"]["location"] == "line 4" and "over the limit" in got["reject"]["reason"]
    assert f"{len(_MIB_OF[b'a']) * (256 if suffix == '.gz' else 1024):,} bytes" in got["reject"]["reason"]


def test_a_1_gib_line_in_a_canonical_store_is_one_reject(tmp_path):
    from pipeline.synthetic.rollouts import synthesize

    records = [json.dumps(r).encode() + b"\n" for r in synthesize("shop", 4, 2, 0)]
    got = score_bombed(tmp_path, "store.jsonl.zst", zstandard.compress(b"".join(records[:2])), zstd_bomb_line(),
                       zstandard.compress(b"\n" + b"".join(records[2:])), fmt="canonical")  # fmt: skip
    assert "1,073,741,824 bytes" in got["reject"]["reason"]
    assert got["counts"]["scored"] == 4 and got["reject"]["location"] == "line 3"


# -- Inspect .eval archives ------------------------------------------------------------------------------


def write_zip(path: Path, members: list[tuple[str, int, int, bytes, int]]) -> None:
    """A ZIP archive of (name, method, crc, stored bytes, uncompressed size) members, as the format lays it out:
    what zipfile cannot write (a zstd member, method 93, before Python 3.14; a member made of repeated blocks)."""
    out, central = bytearray(), bytearray()
    for name, method, crc, data, size in members:
        encoded = name.encode()
        offset = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size, len(encoded), 0)
        out += encoded + data
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(data), size,
                               len(encoded), 0, 0, 0, 0, 0, offset) + encoded  # fmt: skip
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))


def zero_crc(size: int) -> int:
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(_MIB_OF[b"\0"], crc)
    return crc


def deflate_bomb() -> tuple[int, bytes]:
    """1 GiB of zeros as raw deflate: one fully flushed block repeated (it refers to nothing before it)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(_MIB_OF[b"\0"]) + c.flush(zlib.Z_FULL_FLUSH)
    return 8, block * 1024 + c.flush(zlib.Z_FINISH)


def zstd_bomb() -> tuple[int, bytes]:
    return 93, zstandard.ZstdCompressor().compress(_MIB_OF[b"\0"]) * 1024


@pytest.mark.parametrize("bomb", [deflate_bomb, zstd_bomb], ids=["deflate", "zstd"])
def test_an_eval_member_bomb_is_one_reject_and_the_other_samples_are_scored(tmp_path, eval_log, bomb):  # noqa: F811
    import zipfile

    with open(eval_log, "rb") as f, zipfile.ZipFile(f) as z:
        members = [(n, 0, z.getinfo(n).CRC, data, len(data)) for n in z.namelist()
                   if isinstance(data := _member(f, z, n, GIB), bytes)]  # fmt: skip
    method, data = bomb()
    members.append(("samples/bomb_epoch_1.json", method, zero_crc(GIB), data, GIB))
    (tmp_path / "logs").mkdir()
    write_zip(tmp_path / "logs" / "night.eval", members)
    assert (tmp_path / "logs" / "night.eval").stat().st_size < 8 << 20
    proc, rss = pexec_rss("score", "logs", "--format", "inspect", "--out", "run", "--inline", "--env", "observed",
                          "--spec", "support", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert rss < RSS_CEILING_MIB, f"peak RSS {rss:.0f} MiB"
    counts = json.loads((tmp_path / "run" / "_manifest.json").read_text())["counts"]
    assert counts["scored"] == 2 and counts["rejected"] == 1
    [reject] = pq.read_table(tmp_path / "run" / "rejects").to_pylist()
    assert reject["location"] == "samples/bomb_epoch_1.json" and "max_member_bytes" in reject["reason"]


def test_a_damaged_eval_archive_is_one_reject_beside_a_sound_one(tmp_path, eval_log):  # noqa: F811
    (tmp_path / "logs").mkdir()
    data = eval_log.read_bytes()
    (tmp_path / "logs" / "a.eval").write_bytes(data)
    (tmp_path / "logs" / "b.eval").write_bytes(data[: len(data) // 2])  # cut short: no central directory
    proc, _ = pexec_rss("score", "logs", "--format", "inspect", "--out", "run", "--inline", "--env", "observed",
                        "--spec", "support", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = json.loads((tmp_path / "run" / "_manifest.json").read_text())["counts"]
    assert counts["scored"] == 2 and counts["rejected"] == 1
    [reject] = pq.read_table(tmp_path / "run" / "rejects").to_pylist()
    assert reject["source"].endswith("b.eval") and "cannot read the .eval archive" in reject["reason"]


# -- malformed raw records --------------------------------------------------------------------------------

BFCL = Path(__file__).resolve().parent / "data" / "bfcl" / "DeepSeek-V3-0324-FC"
MALFORMED = [
    b"[]",
    b"5",
    b'{"id": {"a": 1}, "result": []}',
    b'{"id": "multi_turn_base_\xff", "result": []}',
    b'{"id": "multi_turn_base_0", "result": [], "latency": ' + b"7" * 5000 + b"}",  # ValueError in the decoder
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in the decoder
    b'{"id": "multi_turn_base_0", "result": [], "latency": ' + b"[" * 900 + b"]" * 900 + b"}",  # deep, decodable
    b'{"id": "multi_turn_base_0", "result": [], "latency": 1' + b"0" * 400 + b"}",  # no float: OverflowError
]


def malformed_bfcl(tmp: Path) -> Path:
    folder = tmp / "bfcl" / "model" / "multi_turn"
    folder.mkdir(parents=True)
    [source] = BFCL.glob("*_result.json")
    [line] = source.read_bytes().splitlines()
    good = [line, line.replace(b'"multi_turn_base_0"', b'"multi_turn_base_1"')]  # the result under a second task
    (folder / source.name).write_bytes(b"\n".join([good[0], *MALFORMED, good[1]]) + b"\n")
    return tmp / "bfcl"


@pytest.mark.parametrize("line", range(len(MALFORMED)))
def test_a_malformed_bfcl_line_stops_ingest_with_one_line(tmp_path, line):
    folder = tmp_path / "m" / "multi_turn"
    folder.mkdir(parents=True)
    [source] = BFCL.glob("*_result.json")
    (folder / source.name).write_bytes(source.read_bytes().splitlines()[0] + b"\n" + MALFORMED[line] + b"\n")
    result = CliRunner().invoke(app, ["ingest", "bfcl", str(tmp_path / "m"), "--out", str(tmp_path / "store")])
    assert (result.exit_code == 2 and result.exception is None) or isinstance(result.exception, SystemExit)
    assert len(result.output.strip().splitlines()) == 1 and "line 2" in result.output, result.output


def test_malformed_bfcl_lines_are_rejects_and_the_rest_is_scored(tmp_path):
    source = malformed_bfcl(tmp_path)
    proc, _ = pexec_rss("score", str(source), "--format", "bfcl", "--out", "run", "--inline", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = json.loads((tmp_path / "run" / "_manifest.json").read_text())["counts"]
    assert counts["scored"] == 2 and counts["rejected"] == len(MALFORMED)
    rejects = pq.read_table(tmp_path / "run" / "rejects").to_pylist()
    assert sorted(r["location"] for r in rejects) == sorted(f"line {n}" for n in range(2, 2 + len(MALFORMED)))
    again, _ = pexec_rss("score", str(source), "--format", "bfcl", "--out", "run", "--inline", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": "multi_turn_base_0", "n": ' + b"7" * 5000 + b"}", "line 2: not readable JSON: Exceeds the limit"),
        (b"[" * 100_000 + b"]" * 100_000, "line 2: not readable JSON: nested deeper"),
    ],
)
def test_a_score_file_that_does_not_decode_is_one_line(tmp_path, line, reason):
    score = tmp_path / "x_score.json"
    score.write_bytes(b'{"accuracy": 0.5}\n' + line + b"\n")
    with pytest.raises(IngestError, match=reason):
        read_scores(score)


def test_a_score_file_is_read_within_its_limit(tmp_path):
    score = tmp_path / "x_score.json"
    score.write_bytes(b'{"accuracy": 0.5}\n' + b'{"id": "multi_turn_base_1"}\n' * 1000)
    assert read_scores(score, limit=score.stat().st_size)[0] == {"multi_turn_base_1"}
    with pytest.raises(IngestError, match="score file over the limit of 28,017 bytes"):
        read_scores(score, limit=score.stat().st_size - 1)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"error": ' + "7" * 5000 + "}", "[" * 995 + "]" * 995, "[1" + "0" * 400 + "]"],
)
def test_the_tool_output_check_answers_for_any_text(text):
    assert is_error_output(text) in (True, False)


def test_a_limit_is_set_by_an_option(tmp_path):
    good = conversations(tmp_path, 3)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_bytes(b"".join(good))
    longest = max(len(line) for line in good)
    proc, _ = pexec_rss("score", "logs", "--format", "openai", "--option", f"max_line_bytes={longest - 2}", "--out",
                        "run", "--inline", "--spec", "support", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = json.loads((tmp_path / "run" / "_manifest.json").read_text())["counts"]
    assert counts["rejected"] >= 1 and counts["read"] == 3
