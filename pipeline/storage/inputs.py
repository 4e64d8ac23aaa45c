"""Input stores: list the data files under a URL, plan shards, read records with their location.

A store is one file or a folder searched recursively. JSON Lines (plain, gzip, zstd) and Parquet are read;
every record comes back with the place it came from, and content that cannot be read comes back as a
`RecordError` in the stream instead of an exception, so that rows read = rows scored + rows rejected.
Errors of the storage layer itself (network, permissions) are raised: they are worth a retry, not a reject.
"""

from __future__ import annotations

import itertools
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Literal

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from pipeline.core.arrow import pa
from pipeline.core.errors import StoreError
from pipeline.storage.fs import StorageOptions, filesystem, list_files
from pipeline.storage.shards import RAW_LIMIT, Compression, Format, InputFile, Record, RecordError, Shard, fingerprint

MAX_LINE_BYTES = 64 * 2**20  # a line of JSON Lines (one record) longer than this is a reject, never held whole
_CHUNK = 1 << 20  # bytes per read of a plain file
_COMPRESSED_CHUNK = 1 << 16  # compressed bytes per read of a gzip file
# zstd's decompressobj has no output limit and a frame of run-length blocks inflates ~32,000-fold: small inputs
# bound each output chunk (1 KiB -> at most ~32 MiB)
_ZSTD_PIECE = 1 << 10
_OUTPUT_CHUNK = 1 << 20  # gzip: decompressed bytes per call (zlib's max_length)
_PARQUET_BATCH_ROWS = 1024  # rollouts are large: bound the Python objects alive at once
# A Parquet row group whose columns decode (by its footer) to more than this is not read: its rows are rejects.
# Arrow holds a row group's dictionaries and a batch of its rows; string columns are read as dictionaries, so a
# value repeated across rows is held once until a row under the record limits is converted.
MAX_ROW_GROUP_BYTES = 256 * 2**20
_PYTHON_PIECE_BYTES = 16 * 2**20  # Arrow bytes of rows converted to Python objects at once (or one row)
_LISTED_ROWS = 100_000  # rows of an unread row group rejected one by one; more: one reject names the range
MAX_RECORD_ITEMS = 1_000_000  # objects and lists in one record (a line, a document, a row's list elements)
_BOM = b"\xef\xbb\xbf"

_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_COMPRESSION_SUFFIXES: tuple[tuple[str, Compression], ...] = ((".gz", "gzip"), (".zst", "zstd"), ("", None))


def list_inputs(url: str, storage_options: StorageOptions | None = None) -> tuple[list[InputFile], list[str]]:
    """Data files of the store sorted by URL, and the URLs of files skipped for their extension.

    Names starting with "." or "_" (at any depth below the store root) are neither read nor reported:
    they are metadata such as `_manifest.json` or `.git/`. A file named directly is read whatever its name.
    """
    try:
        entries = list_files(url, storage_options)
    except (ValueError, ImportError) as e:  # unknown protocol, or its package is not installed
        raise StoreError(f"cannot open store {url}: {e}") from e
    except Exception as e:  # the storage backend's own errors (connection, credentials, permissions)
        raise StoreError(f"cannot list store {url}: {type(e).__name__}: {e}") from e
    if entries is None:
        raise StoreError(f"no such store: {url}")
    files: list[InputFile] = []
    ignored: list[str] = []
    for file_url, info in entries.items():
        kind = classify(file_url)
        if kind is None:
            ignored.append(file_url)
            continue
        size = int(info["size"])
        files.append(InputFile(file_url, kind[0], kind[1], size, fingerprint(size, info)))
    if not files:
        hint = f" ({len(ignored)} other files ignored, e.g. {ignored[0]})" if ignored else ""
        raise StoreError(f"no data files under {url}{hint}")
    return files, ignored


def plan_shards(
    files: Sequence[InputFile], target_bytes: int = 64 * 2**20, storage_options: StorageOptions | None = None
) -> list[Shard]:
    """Cut files into shards of about `target_bytes`: Parquet by row groups, JSON Lines as `line_shards`."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be at least 1, got {target_bytes}")
    sizes = decompressed_sizes(files, storage_options)
    shards: list[Shard] = []
    for file in files:
        if file.fmt == "parquet":
            shards.extend(_parquet_shards(file, target_bytes, storage_options))
        else:
            shards.extend(_line_ranges(file, sizes.get(file.url, file.size), target_bytes))
    return shards


def line_shards(
    files: Sequence[InputFile], target_bytes: int, storage_options: StorageOptions | None = None
) -> list[Shard]:
    """Shards of line-delimited files (and of other files, read whole): byte ranges of about `target_bytes`. A
    compressed file's ranges are of its decompressed bytes (`split_by_bytes`), planned when its whole stream
    decompresses cleanly; a damaged or truncated one stays one shard, which names where it breaks."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be at least 1, got {target_bytes}")
    sizes = decompressed_sizes(files, storage_options)
    return [s for file in files for s in _line_ranges(file, sizes.get(file.url, file.size), target_bytes)]


def _line_ranges(file: InputFile, size: int | None, target_bytes: int) -> list[Shard]:
    if file.fmt != "jsonl" or size is None or size <= target_bytes:
        return [Shard(file, 0, None)]
    return [Shard(file, start, min(start + target_bytes, size)) for start in range(0, size, target_bytes)]


def decompressed_sizes(
    files: Sequence[InputFile], storage_options: StorageOptions | None = None
) -> dict[str, int | None]:
    """The decompressed size of each compressed JSON Lines file, None for one whose stream is damaged or cut
    short: each decompressed once, checksums verified, several at a time (zlib and zstd decompress outside the
    GIL)."""
    todo = [f for f in files if f.fmt == "jsonl" and f.compression is not None]
    if not todo:
        return {}
    with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
        sizes = list(pool.map(lambda f: _decompressed_size(f, storage_options), todo))
    return {f.url: size for f, size in zip(todo, sizes, strict=True)}


def _decompressed_size(file: InputFile, storage_options: StorageOptions | None) -> int | None:
    assert file.compression is not None
    fs, path = filesystem(file.url, storage_options)
    with fs.open(path, "rb") as f:
        _check_unchanged(f, file)
        size = 0
        try:
            for _, chunk in _members(f, file.compression):
                size += len(chunk or b"")
        except (_Truncated, _Damaged):
            return None
    return size


def read_shard(
    shard: Shard,
    storage_options: StorageOptions | None = None,
    max_line: int = MAX_LINE_BYTES,
    max_items: int = MAX_RECORD_ITEMS,
    max_row_group: int = MAX_ROW_GROUP_BYTES,
) -> Iterator[tuple[str, Record]]:
    """Yield (location, record or RecordError) for every record of the shard, in file order.

    Locations: "line N" (1-based) in whole-file JSONL shards and ranges of compressed ones, "byte N" (offset of
    the line's first byte) in byte-range shards of plain files, "row N" (0-based within the file) in Parquet.
    Blank lines are not records. A corrupt compressed stream or Parquet file ends the shard with one RecordError at
    the point of failure. The record limits hold before a record is decoded into Python objects: a line over
    `max_line` bytes is a RecordError, never held whole, as is a line of more than `max_items` objects and lists;
    a Parquet row is one when its columns decode to more than `max_line` bytes or its lists hold more than
    `max_items` elements, and the rows
    of a row group that decodes (by its footer) to more than `max_row_group` bytes are RecordErrors, unread.
    """
    if shard.file.fmt == "parquet":
        fs, path = filesystem(shard.file.url, storage_options)
        with fs.open(path, "rb") as f:
            _check_unchanged(f, shard.file)
            yield from _read_parquet(f, shard, _RowLimits(max_line, max_items, max_row_group))
        return
    for location, line in shard_lines(shard, storage_options, max_line):
        record = line if isinstance(line, RecordError) else parse_line(line, max_items)
        if record is not None:
            yield location, record


def shard_lines(
    shard: Shard, storage_options: StorageOptions | None = None, max_line: int = MAX_LINE_BYTES
) -> Iterator[tuple[str, bytes | RecordError]]:
    """(location, line) for every line of a line-delimited shard, blank ones included, decompressed as it is
    read (`read_shard` names the locations): a line over `max_line` bytes, and the unreadable rest of a damaged
    compressed file, come as a RecordError instead. A range of a compressed file (`split_by_bytes`) is read from
    the batch `supplied` for it, else from the file's start; its lines are named "line N" as in a whole-file
    read."""
    if split_by_bytes(shard):
        yield from _split_lines(shard, storage_options, max_line)
        return
    fs, path = filesystem(shard.file.url, storage_options)
    with fs.open(path, "rb") as f:
        _check_unchanged(f, shard.file)
        if shard.whole_file:
            yield from _numbered_lines(f, shard.file.compression, max_line)
        else:
            yield from _range_lines(f, shard.start, shard.stop, max_line)


def read_whole(file: InputFile, storage_options: StorageOptions | None, limit: int) -> bytes | RecordError:
    """The whole (decompressed) content of a file read as one document: a RecordError when it is over `limit`
    bytes (what is past the limit is never read) or its compressed stream is damaged."""
    fs, path = filesystem(file.url, storage_options)
    with fs.open(path, "rb") as f:
        _check_unchanged(f, file)
        parts, held = [], 0
        try:
            for chunk in _chunks(f, file.compression):
                parts.append(chunk)
                held += len(chunk)
                if held > limit:
                    head = b"".join(parts)[: 4 * RAW_LIMIT + 4]
                    return RecordError(f"document over the limit of {limit:,} bytes (max_record_bytes)", _raw(head))
        except (_Truncated, _Damaged) as e:
            return RecordError(f"unreadable {file.compression} stream: {e}", "")
    return b"".join(parts)


def parse_line(line: bytes, max_items: int = MAX_RECORD_ITEMS) -> Record | None:
    """A JSON Lines record (a JSON object), a RecordError saying why it is not one, or None for a blank line. A
    line of more than `max_items` objects and lists is a RecordError before it is decoded."""
    if (items := over_items(line, max_items)) is not None:
        return RecordError(f"record of {items:,} objects and lists is over the limit of {max_items:,} "
                           "(max_record_items)", _raw(line))  # fmt: skip
    return _parse(line)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included


def over_items(data: bytes | str, limit: int) -> int | None:
    """How many objects and lists the JSON text `data` opens when that is more than `limit`, else None: counted
    before it is decoded (in C: brackets first, then brackets outside strings only when those are too many)."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return None
    bare = _STRING.sub(b"", raw)
    items = bare.count(b"{") + bare.count(b"[")
    return items if items > limit else None


def line_numbers(
    file: InputFile, offsets: Iterable[int], storage_options: StorageOptions | None = None
) -> dict[int, int]:
    """The 1-based line number of each line starting at one of `offsets` in a plain JSON Lines file: how a
    record found in a byte-range shard ("byte N") is named as a whole-file read names it ("line N")."""
    wanted = sorted(set(offsets))
    out: dict[int, int] = {}
    fs, path = filesystem(file.url, storage_options)
    with fs.open(path, "rb") as f:
        _check_unchanged(f, file)
        newlines = pos = 0
        chunks = _chunks(f, None)
        chunk = b""
        for offset in wanted:  # one pass: each chunk is counted up to the next offset, then past it
            while pos + len(chunk) < offset and (more := next(chunks, None)) is not None:
                newlines += chunk.count(b"\n")
                pos += len(chunk)
                chunk = more
            out[offset] = newlines + chunk.count(b"\n", 0, offset - pos) + 1
    return out


# --- listing -------------------------------------------------------------------------------------------


def classify(name: str) -> tuple[Format, Compression] | None:
    """The format and compression a file name says, or None when it is not a data file."""
    lower = name.lower()
    if lower.endswith(".parquet"):
        return "parquet", None
    for suffix, compression in _COMPRESSION_SUFFIXES:
        if lower.endswith(suffix) and lower.removesuffix(suffix).endswith(_JSONL_SUFFIXES):
            return "jsonl", compression
    return None


# --- planning ------------------------------------------------------------------------------------------


def _parquet_shards(file: InputFile, target_bytes: int, storage_options: StorageOptions | None) -> list[Shard]:
    fs, path = filesystem(file.url, storage_options)
    with fs.open(path, "rb") as f:
        source = _Source(f)
        try:
            meta = pq.read_metadata(source)
        except (pa.ArrowException, OSError):
            if source.failed:
                raise
            return [Shard(file, 0, None)]  # unreadable footer: read_shard reports it as one reject
    groups: list[Shard] = []
    begin, size, rows = 0, 0, 0
    for i in range(meta.num_row_groups):
        row_group = meta.row_group(i)
        size += sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns))
        rows += row_group.num_rows
        if size >= target_bytes and i + 1 < meta.num_row_groups:
            groups.append(Shard(file, begin, i + 1, rows))
            begin, size, rows = i + 1, 0, 0
    if not groups:
        return [Shard(file, 0, None, meta.num_rows)]
    groups.append(Shard(file, begin, meta.num_row_groups, rows))
    return groups


# --- reading -------------------------------------------------------------------------------------------


class _Truncated(EOFError):
    """A compressed file ended inside a member (gzip) or frame (zstd)."""


class _Damaged(ValueError):
    """A member (frame) of a compressed file does not decode or fails its checksum."""

    def __init__(self, begin: int, cause: Exception) -> None:
        super().__init__(str(cause))
        self.begin = begin  # compressed offset where the damaged member starts


Codec = Literal["gzip", "zstd"]  # a compression that is one
_MEMBER: dict[Codec, str] = {"gzip": "member", "zstd": "frame"}


class _Source:
    """File wrapper that remembers whether the storage layer failed, because pyarrow reports corrupt
    content as OSError too and only storage failures should propagate."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.failed = False

    def read(self, size: int = -1) -> bytes:
        try:
            return self._f.read(size)
        except Exception:
            self.failed = True
            raise

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    @property
    def closed(self) -> bool:
        return self._f.closed


def _check_unchanged(f: IO[bytes], file: InputFile) -> None:
    # Byte ranges and row groups planned on another version of the file would read the wrong records.
    size = f.seek(0, 2)
    f.seek(0)
    if size != file.size:
        raise StoreError(f"{file.url} changed since it was listed: size {file.size}, now {size}")


@dataclass(frozen=True)
class Overlong:
    """A line longer than the limit: only its length and first bytes are kept."""

    size: int
    head: bytes

    def reject(self, limit: int) -> RecordError:
        return RecordError(f"line of {self.size:,} bytes is over the limit of {limit:,} bytes (max_line_bytes)",
                           _raw(self.head))  # fmt: skip


class _Lines:
    """Split byte chunks into lines (newline removed), each with the offset of its first byte. A line longer
    than `max_line` comes as an `Overlong`: its bytes past the limit are counted, not kept."""

    def __init__(
        self, chunks: Iterable[bytes], offset: int = 0, keep_last: bool = True, max_line: int = MAX_LINE_BYTES
    ) -> None:
        self._chunks = chunks
        self._offset = offset
        self._keep_last = keep_last  # False: an unterminated last line stays pending (the cut of a broken file)
        self._max = max_line
        self._parts: list[bytes] = []  # the line being assembled; a list so long lines are joined once
        self._held = 0  # bytes in _parts
        self._over: Overlong | None = None  # the line being skipped, once over the limit

    def _add(self, piece: bytes) -> None:
        if self._over is not None:
            self._over = Overlong(self._over.size + len(piece), self._over.head)
            return
        self._parts.append(piece)
        self._held += len(piece)
        if self._held > self._max:
            head = b"".join(itertools.islice(self._parts, 0, 4 * RAW_LIMIT + 4))[: 4 * RAW_LIMIT + 4]
            self._over = Overlong(self._held, head)
            self._parts.clear()
            self._held = 0

    def _take(self) -> bytes | Overlong:
        if self._over is not None:
            line: bytes | Overlong = self._over
            self._over = None
        else:
            line = b"".join(self._parts)
        self._parts.clear()
        self._held = 0
        return line

    def __iter__(self) -> Iterator[tuple[int, bytes | Overlong]]:
        pos = line_start = self._offset
        for chunk in self._chunks:
            i = 0
            while (j := chunk.find(b"\n", i)) >= 0:
                self._add(chunk[i:j])
                yield line_start, self._take()
                line_start = pos + j + 1
                i = j + 1
            if i < len(chunk):
                self._add(chunk[i:])
            pos += len(chunk)
        if (self._parts or self._over is not None) and self._keep_last:  # a last line without a trailing newline
            yield line_start, self._take()

    def pending(self) -> bytes:
        """The incomplete line held when the chunk source failed (its first bytes when it is over the limit)."""
        return self._over.head if self._over is not None else b"".join(self._parts)


def _chunks(f: IO[bytes], compression: Compression, limit: int | None = None) -> Iterator[bytes]:
    """The file's bytes, decompressed; with `limit`, only its first `limit` decompressed bytes."""
    if compression is None:
        while data := f.read(_CHUNK):
            yield data
        return
    left = limit
    if left == 0:
        return
    for _, chunk in _members(f, compression):
        if chunk is None:
            continue
        if left is not None:
            chunk = chunk[:left]
            left -= len(chunk)
        if chunk:
            yield chunk
        if left == 0:
            return


class _GzipMember:
    """zlib's decoder of one gzip member, each call's output bounded by max_length (the input not yet used waits in
    unconsumed_tail)."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=31)

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    def decode(self, data: bytes) -> Iterator[bytes]:
        out = self._d.decompress(data, _OUTPUT_CHUNK)
        while self._d.unconsumed_tail and not self._d.eof:
            if out:
                yield out
            out = self._d.decompress(self._d.unconsumed_tail, _OUTPUT_CHUNK)
        if out:
            yield out


class _ZstdFrame:
    """zstandard's decoder of one zstd frame (the pieces it is fed are small: its output is bounded by them)."""

    def __init__(self) -> None:
        self._d = zstandard.ZstdDecompressor().decompressobj()

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    def decode(self, data: bytes) -> Iterator[bytes]:
        if out := self._d.decompress(data):
            yield out


def _members(f: IO[bytes], compression: Codec) -> Iterator[tuple[int, bytes | None]]:
    """Decompress a gzip or zstd file member by member (frame by frame): (compressed offset where the member
    began, decompressed chunk), and (offset, None) once a member has ended with its checksum verified.

    Raises _Truncated when the file ends inside a member, and _Damaged when a member does not decode or fails
    its checksum: gzip checks its CRC only at the member's end, so damaged data can first decode into plausible
    text.
    (Not gzip.GzipFile or zstandard's stream_reader: they hide where a member begins and one ends silently.)
    """
    new: type[_GzipMember | _ZstdFrame] = _GzipMember if compression == "gzip" else _ZstdFrame
    dobj, begin, consumed, data = new(), 0, 0, b""
    in_member = False
    piece = _ZSTD_PIECE if compression == "zstd" else _COMPRESSED_CHUNK
    while True:
        if not data:
            data = f.read(piece)
            if not data:
                break
        if not in_member:
            stripped = data.lstrip(b"\x00")  # zero padding between or after members is allowed
            consumed += len(data) - len(stripped)
            data, begin, in_member = stripped, consumed, bool(stripped)
            if not data:
                continue
        try:
            for out in dobj.decode(data):
                yield begin, out
        except (zlib.error, zstandard.ZstdError) as e:
            raise _Damaged(begin, e) from e
        if dobj.eof:
            rest = dobj.unused_data
            consumed += len(data) - len(rest)
            yield begin, None
            dobj, data, in_member = new(), rest, False
        else:
            consumed += len(data)
            data = b""
    if in_member:
        size = f.seek(0, 2)
        raise _Truncated(
            f"the file ends ({size} bytes) inside the {_MEMBER[compression]} starting at compressed byte {begin}"
        )


def _verified(f: IO[bytes], compression: Codec) -> tuple[int | None, str, str]:
    """Decompress the whole file once: how many decompressed bytes can be trusted (None: all), and what went
    wrong: ("truncated" or "corrupt", detail). A file cut short keeps what it decoded; a damaged member loses
    all of itself (where in it the damage lies is unknown) and everything after it."""
    verified = decoded = 0
    try:
        for _, chunk in _members(f, compression):
            if chunk is None:
                verified = decoded
            else:
                decoded += len(chunk)
    except _Truncated as e:
        return decoded, "truncated", str(e)
    except _Damaged as e:
        lost = f"compressed bytes {e.begin}-{f.seek(0, 2)}"
        member = _MEMBER[compression]
        damaged = f"the {member} starting at compressed byte {e.begin} is damaged ({e})"
        return verified, "corrupt", f"{damaged}: it and the rest of the file ({lost}) are lost"
    return None, "", ""


def _decoded_lines(f: IO[bytes], compression: Compression, max_line: int) -> tuple[_Lines, str | None]:
    """The file's lines (only those that can be trusted), and what was wrong with the file (None: nothing) as
    a reason with a `{where}` to fill in.

    A compressed file is checked whole before its lines are read: a damaged gzip member can decode into
    wrong but well-formed records before its checksum fails at the member's end."""
    limit, kind, detail = _verified(f, compression) if compression else (None, "", "")
    f.seek(0)
    problem = f"{kind} {compression} stream {{where}}: {detail}" if kind else None
    return _Lines(_chunks(f, compression, limit), keep_last=problem is None, max_line=max_line), problem


def _numbered_lines(f: IO[bytes], compression: Compression, max_line: int) -> Iterator[tuple[str, bytes | RecordError]]:
    lines, problem = _decoded_lines(f, compression, max_line)
    n = 0
    for _, line in lines:
        n += 1
        yield f"line {n}", _line(line, n == 1, max_line)
    if problem:
        where = f"after line {n}" if n else "at the start"
        yield f"line {n + 1}", RecordError(problem.format(where=where), _raw(lines.pending()))


def _range_lines(
    f: IO[bytes], start: int, stop: int | None, max_line: int
) -> Iterator[tuple[str, bytes | RecordError]]:
    # A shard owns the lines whose first byte lies in [start, stop). Reading from start-1, the first line
    # seen is the one holding byte start-1, which began before start: skip it, and what follows starts at
    # or after start (a line starting exactly at start is kept because byte start-1 is then its newline).
    pos = max(start - 1, 0)
    f.seek(pos)
    lines = iter(_Lines(_chunks(f, None), offset=pos, max_line=max_line))
    if start > 0:
        next(lines, None)
    for offset, line in lines:
        if stop is not None and offset >= stop:
            break
        yield f"byte {offset}", _line(line, offset == 0, max_line)


# --- a compressed file split by bytes -------------------------------------------------------------------
#
# A compressed stream cannot seek: a range of its decompressed bytes is read by decompressing from the file's
# start. So the ranges of one file are read by one streaming pass (`stream_batches`, in the scoring driver a Ray
# task per file) that hands each range's lines on as a `LineBatch` as soon as the stream is past it, and the
# task given a range reads its batch (`supplied`) instead of the file.


@dataclass(frozen=True)
class LineBatch:
    """The lines of one range of a compressed line-delimited file, as one streaming read of the file found them."""

    shard: str  # the key of the shard (range) it holds
    first_line: int  # the 1-based line number of its first line in the file
    data: bytes  # its lines within the limit, each ended by a newline
    max_line: int  # the line limit it was read with
    overlong: tuple[tuple[int, Overlong], ...] = ()  # (index among its lines, the line) of lines over the limit


def split_by_bytes(shard: Shard) -> bool:
    """Whether the shard is a range of a compressed line-delimited file's decompressed bytes."""
    return shard.file.fmt == "jsonl" and shard.file.compression is not None and not shard.whole_file


_SUPPLIED: ContextVar[LineBatch | None] = ContextVar("pexec_supplied_lines", default=None)


@contextmanager
def supplied(batch: LineBatch) -> Iterator[None]:
    """Within the block, reading the shard `batch` holds reads the batch, not the file."""
    token = _SUPPLIED.set(batch)
    try:
        yield
    finally:
        _SUPPLIED.reset(token)


def stream_batches(
    shards: Sequence[Shard], storage_options: StorageOptions | None = None, max_line: int = MAX_LINE_BYTES
) -> Iterator[LineBatch]:
    """One `LineBatch` per shard of `shards` (ranges of one compressed file), in the order of their starts, each
    yielded once the stream is past it: the file is decompressed once, up to the end of the last range, holding
    one range's lines at a time. A range owns the lines whose first byte lies in it, as a plain file's does.

    The plan verified the stream whole (`decompressed_sizes`); a stream that now fails its checksum or ends early
    was changed since: a StoreError, not rejects."""
    wanted = sorted(shards, key=lambda s: s.start)
    if not wanted:
        return
    file = wanted[0].file
    if not all(split_by_bytes(s) and s.file == file for s in wanted):
        raise ValueError("stream_batches reads ranges of one compressed file")
    assert file.compression is not None
    fs, path = filesystem(file.url, storage_options)
    with fs.open(path, "rb") as f:
        _check_unchanged(f, file)
        batch = _BatchBuilder(wanted[0].key, max_line)
        now, lines = 0, 0  # index in `wanted`, lines seen
        try:
            for offset, line in _Lines(_chunks(f, file.compression), max_line=max_line):
                lines += 1
                while offset >= _stop(wanted[now]):
                    yield batch.built(lines)
                    now += 1
                    if now == len(wanted):
                        return
                    batch = _BatchBuilder(wanted[now].key, max_line)
                if offset >= wanted[now].start:
                    batch.add(line, lines)
        except (_Truncated, _Damaged) as e:
            raise StoreError(f"{file.url} changed since it was planned: its {file.compression} stream: {e}") from e
    yield batch.built(lines + 1)
    for shard in wanted[now + 1 :]:  # ranges past the last line (a long last line spans them)
        yield _BatchBuilder(shard.key, max_line).built(lines + 1)


def with_batches(
    shards: Sequence[Shard], storage_options: StorageOptions | None = None, max_line: int = MAX_LINE_BYTES
) -> Iterator[tuple[Shard, LineBatch | None]]:
    """Each shard in order, with its lines when it is a range of a compressed file (else None): each run of
    consecutive ranges of one file is read by one streaming pass (`stream_batches`), in this process."""
    for ranges in file_runs(shards):
        if split_by_bytes(ranges[0]):
            yield from zip(ranges, stream_batches(ranges, storage_options, max_line), strict=True)
        else:
            yield ranges[0], None


def file_runs(shards: Sequence[Shard]) -> Iterator[list[Shard]]:
    """`shards` in order, grouped as they are read: each run of consecutive ranges of one compressed file (split by
    bytes) as one group, sorted by start, to be read by one streaming pass; any other shard alone."""
    i = 0
    while i < len(shards):
        j = i + 1
        if split_by_bytes(shards[i]):
            while j < len(shards) and split_by_bytes(shards[j]) and shards[j].file == shards[i].file:
                j += 1
        yield sorted(shards[i:j], key=lambda s: s.start)
        i = j


def _stop(shard: Shard) -> int:
    assert shard.stop is not None
    return shard.stop


class _BatchBuilder:
    def __init__(self, shard: str, max_line: int) -> None:
        self._shard = shard
        self._max = max_line
        self._data = bytearray()
        self._overlong: list[tuple[int, Overlong]] = []
        self._count = 0
        self._first: int | None = None

    def add(self, line: bytes | Overlong, number: int) -> None:
        if self._first is None:
            self._first = number
        if isinstance(line, Overlong):
            self._overlong.append((self._count, line))
        else:
            self._data += line
            self._data += b"\n"
        self._count += 1

    def built(self, next_line: int) -> LineBatch:
        first = next_line if self._first is None else self._first
        return LineBatch(self._shard, first, bytes(self._data), self._max, tuple(self._overlong))


def _split_lines(
    shard: Shard, storage_options: StorageOptions | None, max_line: int
) -> Iterator[tuple[str, bytes | RecordError]]:
    batch = _SUPPLIED.get()
    if batch is None or batch.shard != shard.key:  # no reader handed it: read the file from its start
        batch = next(stream_batches([shard], storage_options, max_line))
    if batch.max_line != max_line:
        raise ValueError(f"lines of shard {shard.key} were read with a line limit of {batch.max_line}, not {max_line}")
    yield from batch_lines(batch)


def batch_lines(batch: LineBatch) -> Iterator[tuple[str, bytes | RecordError]]:
    """(location, line) for every line of the batch, as `shard_lines` of a whole-file read names them."""
    overlong = dict(batch.overlong)
    data, pos, index, number = batch.data, 0, 0, batch.first_line
    while True:
        if (over := overlong.get(index)) is not None:
            yield f"line {number}", over.reject(batch.max_line)
        elif pos < len(data):
            end = data.index(b"\n", pos)
            yield f"line {number}", _line(data[pos:end], number == 1, batch.max_line)
            pos = end + 1
        else:
            return
        index += 1
        number += 1


def _line(line: bytes | Overlong, at_file_start: bool, max_line: int) -> bytes | RecordError:
    if isinstance(line, Overlong):
        return line.reject(max_line)
    if at_file_start and line.startswith(_BOM):  # editors on Windows write one; orjson refuses it
        return line[len(_BOM) :]
    return line


def _parse(line: bytes) -> Record | None:
    if not line.strip():
        return None
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as u:
            return RecordError(f"invalid UTF-8: {u}", _raw(line))
        return RecordError(f"invalid JSON: {e}", _raw(line))
    if not isinstance(value, dict):
        kind = "null" if value is None else type(value).__name__
        return RecordError(f"record is not a JSON object (got {kind})", _raw(line))
    return value


def _raw(line: bytes) -> str:
    # 4 bytes per character at most: decoding this much yields RAW_LIMIT whole characters.
    return line[: 4 * RAW_LIMIT + 4].decode("utf-8", "replace").rstrip("\r")[:RAW_LIMIT]


@dataclass(frozen=True)
class _RowLimits:
    row_bytes: int  # Arrow bytes of one row's columns, decoded (the line limit of JSON Lines)
    items: int  # elements of one row's lists
    group_bytes: int  # a row group's decoded bytes, by its footer


def _read_parquet(f: IO[bytes], shard: Shard, limits: _RowLimits) -> Iterator[tuple[str, Record]]:
    source = _Source(f)
    row: int | None = None
    try:
        meta = pq.ParquetFile(source).metadata
        stop = meta.num_row_groups if shard.stop is None else shard.stop
        parquet = pq.ParquetFile(source, metadata=meta, read_dictionary=_dictionary_columns(meta, shard.start, stop))
        row = sum(meta.row_group(i).num_rows for i in range(shard.start))
        for group in range(shard.start, stop):
            info = meta.row_group(group)
            if info.total_byte_size > limits.group_bytes:
                yield from _unread_group(group, row, info.num_rows, info.total_byte_size, limits.group_bytes)
                row += info.num_rows
                continue
            # One row group at a time, so a failure is placed at the first row not yet returned.
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group]):
                for piece, size, items in _pieces(batch, limits):
                    if size > limits.row_bytes or items > limits.items:
                        yield f"row {row}", _oversized_row(size, items, limits)
                        row += 1
                        continue
                    for record in _batch_records(piece):
                        yield f"row {row}", record
                        row += 1
    except (pa.ArrowException, OSError) as e:
        if source.failed:
            raise
        where = f"row group {shard.start}" if row is None else f"row {row}"
        yield where, RecordError(f"unreadable Parquet at {where}: {e}", "")


def _dictionary_columns(meta: pq.FileMetaData, start: int, stop: int) -> list[str]:
    """The top-level string and binary columns dictionary-encoded in a row group of [start, stop): read as
    dictionaries, a value that repeats is held once (a footer's sizes count it once; dense, each row holds it)."""
    names = set()
    for group in range(start, stop):
        info = meta.row_group(group)
        for c in range(info.num_columns):
            column = info.column(c)
            if column.has_dictionary_page and "." not in column.path_in_schema and column.physical_type == "BYTE_ARRAY":
                names.add(column.path_in_schema)
    return sorted(names)


def _unread_group(group: int, row: int, rows: int, size: int, limit: int) -> Iterator[tuple[str, RecordError]]:
    reason = (f"Parquet row group {group} decodes to {size:,} bytes, over the limit of {limit:,} bytes "
              "(max_row_group_bytes): its rows are not read")  # fmt: skip
    if rows <= _LISTED_ROWS:
        for i in range(row, row + rows):
            yield f"row {i}", RecordError(reason, "")
    else:  # a footer can claim any number of rows: one reject names them all
        yield f"rows {row}-{row + rows - 1}", RecordError(reason, "")


def _oversized_row(size: int, items: int, limits: _RowLimits) -> RecordError:
    if size > limits.row_bytes:
        return RecordError(f"Parquet row of {size:,} bytes decoded is over the limit of {limits.row_bytes:,} bytes "
                           "(max_line_bytes)", "")  # fmt: skip
    return RecordError(f"Parquet row of {items:,} list elements is over the limit of {limits.items:,} "
                       "(max_record_items)", "")  # fmt: skip


def _pieces(batch: pa.RecordBatch, limits: _RowLimits) -> Iterator[tuple[pa.RecordBatch, int, int]]:
    """`batch` cut into consecutive pieces small enough to convert to Python objects at once (at most
    _PYTHON_PIECE_BYTES of Arrow, or one row), each with its decoded bytes and list elements: a one-row piece
    over a limit is that row's reject."""
    stack = [batch]
    while stack:
        piece = stack.pop()
        size, items = _decoded_size(piece)
        fits = size <= min(_PYTHON_PIECE_BYTES, limits.row_bytes) and items <= limits.items
        if fits or piece.num_rows == 1:
            yield piece, size, items
        else:
            half = piece.num_rows // 2
            stack += [piece.slice(half), piece.slice(0, half)]


def _decoded_size(piece: pa.RecordBatch) -> tuple[int, int]:
    """(bytes its columns hold once decoded, elements of its top-level lists) of rows of a batch: a dictionary
    column counts each row's value (its dictionary may be shared by many rows)."""
    size = items = 0
    for column in piece.columns:
        kind = column.type
        if pa.types.is_dictionary(kind) and (pa.types.is_string(kind.value_type) or pa.types.is_binary(kind.value_type)
                                             or pa.types.is_large_string(kind.value_type)
                                             or pa.types.is_large_binary(kind.value_type)):  # fmt: skip
            lengths = pc.binary_length(column.dictionary).take(column.indices)
            size += (pc.sum(lengths).as_py() or 0) + column.indices.nbytes
        else:
            size += column.nbytes
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            items += pc.sum(pc.list_value_length(column)).as_py() or 0
    return size, items


def _batch_records(batch: pa.RecordBatch) -> list[Record]:
    try:
        rows: list[Record] = batch.to_pylist(maps_as_pydicts="strict")  # a dict per row
        return rows
    except KeyError:  # a map column with a duplicate key somewhere in the batch: find the rows
        return [_row_record(batch.slice(i, 1)) for i in range(batch.num_rows)]


def _row_record(row: pa.RecordBatch) -> Record:
    try:
        record: Record = row.to_pylist(maps_as_pydicts="strict")[0]  # a dict
        return record
    except KeyError as e:
        return RecordError(f"Parquet row not convertible: {e.args[0]}", repr(row.to_pylist()[0])[:RAW_LIMIT])


def raw_text(data: bytes) -> str:
    """At most RAW_LIMIT characters of `data` as text: what a reject keeps of the bytes it was made of."""
    return _raw(data)
