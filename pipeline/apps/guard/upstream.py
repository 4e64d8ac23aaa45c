"""The MCP proxy's two stdio pipes, bounded: the upstream server's process (a client transport for the SDK's
`Client`) and the host's requests on stdin.

Both read newline-delimited JSON-RPC themselves, a line at most `max_line` bytes:
- from the upstream, a longer line (a huge result) is dropped while it streams and its request answered with
  a JSON-RPC error naming the limit; a line that is not JSON-RPC is counted and reported on stderr in one line
  (the first, then at powers of ten), never as a traceback; the end of its output marks it dead, said on stderr;
- from the host, a line the SDK cannot read (too long, too deep, not JSON-RPC) is answered through the SDK as a
  refusal instead of being left unanswered.
The upstream gets a minimal environment (PATH, HOME, the locale) and what `--env-allow` names, less what `--env-deny`
names in any case (shell patterns on names).
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import anyio
import mcp.types as types
import orjson
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

MAX_LINE = 16 * 1024 * 1024  # bytes of one JSON-RPC message either way (a request, an upstream's result)
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')
_NAME = re.compile(rb'"name"\s*:\s*"((?:[^"\\]|\\.){1,200})"')
_STOP_WAIT = 2.0  # seconds the upstream has to exit after its stdin closes, before it is killed
REFUSED_TOOL = "\x00pexec-refused"  # what an unreadable host request becomes (answered by the proxy)


# What the upstream gets of the proxy's environment unless `--env-allow` names more: a program's search path, its
# home, its locale. Not pexec's own tokens, a cloud's keys or anything else the proxy was started with.
MINIMAL_ENVIRONMENT = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_*")


def upstream_environment(allow: list[str], deny: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The proxy's environment for the upstream: the variables MINIMAL_ENVIRONMENT names and those matching an
    `allow` pattern (names as written), less those matching a `deny` pattern in any case (`*secret*` keeps
    `AWS_SECRET_ACCESS_KEY` back too)."""
    env = dict(os.environ if base is None else base)
    patterns = [*MINIMAL_ENVIRONMENT, *allow]
    denied = [p.upper() for p in deny]
    return {
        k: v
        for k, v in env.items()
        if any(fnmatch.fnmatchcase(k, p) for p in patterns)
        and not any(fnmatch.fnmatchcase(k.upper(), p) for p in denied)
    }


RequestId = int | str  # a JSON-RPC id
# What the SDK's Client reads from and writes to (a client transport's two streams).
Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]


def _first_id(head: bytes) -> RequestId | None:
    found = _ID.search(head)
    if found is None:
        return None
    request_id: RequestId = orjson.loads(found[1])  # _ID matches a JSON integer or string only
    return request_id


class ByteSource(Protocol):
    """A stream of bytes (anyio's ByteReceiveStream, or stdin through _FileBytes); anyio.EndOfStream at its end."""

    async def receive(self) -> bytes: ...


class LineReader:
    """Lines of at most `limit` bytes from a byte stream; a longer one is given as (None, its first 4 KiB)."""

    def __init__(self, stream: ByteSource, limit: int) -> None:
        self.stream, self.limit = stream, limit
        self._buffer = bytearray()
        self._skipping: bytes | None = None  # the head of a line being dropped

    async def __aiter__(self) -> AsyncIterator[tuple[bytes | None, bytes]]:
        while True:
            try:
                chunk = await self.stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                if self._buffer.strip() and self._skipping is None:
                    yield bytes(self._buffer), b""
                return
            while chunk:
                cut = chunk.find(b"\n")
                piece, chunk = (chunk, b"") if cut < 0 else (chunk[:cut], chunk[cut + 1 :])
                if self._skipping is None:
                    self._buffer += piece
                    if len(self._buffer) > self.limit:
                        self._skipping, self._buffer = bytes(self._buffer[:4096]), bytearray()
                if cut < 0:
                    break
                if self._skipping is not None:
                    yield None, self._skipping
                    self._skipping = None
                elif self._buffer.strip():
                    yield bytes(self._buffer), b""
                self._buffer = bytearray()


@dataclass
class UpstreamState:
    """What the proxy knows of its upstream's health."""

    exit_code: int | None = None
    dead: bool = False
    garbage: int = 0  # lines that were not JSON-RPC
    oversized: int = 0  # lines over the limit

    def note(self, text: str) -> None:
        print(f"pexec guard: {text}", file=sys.stderr, flush=True)

    def junk(self, line: bytes) -> None:
        self.garbage += 1
        n = self.garbage
        if n == 1 or (n >= 10 and str(n).strip("0") == "1"):  # 1, 10, 100, …
            excerpt = line[:120].decode("utf-8", "replace").encode("unicode_escape").decode()
            self.note(f"the upstream wrote {n} line(s) that are not JSON-RPC; the latest begins {excerpt!r}")


class UpstreamTransport:
    """A client transport (what `mcp.Client` accepts) over the upstream's process; `state` says whether it is
    alive. Results over `max_line` bytes become JSON-RPC errors for their request."""

    def __init__(self, command: list[str], env: dict[str, str], max_line: int = MAX_LINE) -> None:
        self.command, self.env, self.max_line = command, env, max_line
        self.state = UpstreamState()
        self._stack: AbstractAsyncContextManager[Streams] | None = None

    async def __aenter__(self) -> Streams:
        self._stack = self._streams()
        return await self._stack.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool | None:
        assert self._stack is not None, "__aexit__ without __aenter__"
        return await self._stack.__aexit__(kind, exc, traceback)

    @asynccontextmanager
    async def _streams(self) -> AsyncIterator[Streams]:
        process = await anyio.open_process(self.command, env=self.env, stderr=None)
        to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](16)

        async def read_upstream() -> None:
            assert process.stdout is not None
            async with to_session:
                async for line, head in LineReader(process.stdout, self.max_line):
                    message = self._message(line, head)
                    if message is not None:
                        await to_session.send(message)
                code = await _exit_code(process)
                self.state.dead, self.state.exit_code = True, code
                self.state.note(f"the upstream MCP server {self.command[0]!r} exited (code {code})")

        async def write_upstream() -> None:
            assert process.stdin is not None
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    try:
                        await process.stdin.send(data.encode() + b"\n")
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        return  # a dead upstream: the reader reports it

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_upstream)
            tasks.start_soon(write_upstream)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process)
                tasks.cancel_scope.cancel()

    def _message(self, line: bytes | None, head: bytes) -> SessionMessage | None:
        if line is None:  # over the limit: its request gets an error instead of the result
            self.state.oversized += 1
            request_id = _first_id(head)
            self.state.note(f"an upstream message over {self.max_line} bytes was dropped (request id {request_id})")
            if request_id is None:
                return None
            error = types.ErrorData(code=-32000, message=f"the upstream's result is over {self.max_line} bytes")
            return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError:
            self.state.junk(line)
            return None


async def _exit_code(process: Process) -> int | None:
    with anyio.move_on_after(_STOP_WAIT):
        return await process.wait()
    return process.returncode


async def _stop(process: Process) -> None:
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(_STOP_WAIT):
        await process.wait()
        return
    process.kill()
    with anyio.move_on_after(_STOP_WAIT):
        await process.wait()


class HostRequests:
    """The host's stdin as the lines `mcp.stdio_server` reads (pass it as its `stdin`): a line the SDK could not
    read — over `max_line`, nested deeper than its parser goes, not JSON-RPC — is rewritten, when it carries an
    id, into a call of REFUSED_TOOL whose arguments say why, so the proxy answers it; without an id (a
    notification) it is dropped with a line on stderr."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.refused = 0

    async def __aiter__(self) -> AsyncIterator[str]:
        stdin = anyio.wrap_file(os.fdopen(os.dup(0), "rb", buffering=0))
        stream = _FileBytes(stdin)
        async for line, head in LineReader(stream, self.max_line):
            if line is not None:
                try:
                    types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    yield line.decode("utf-8", "replace")
                    continue
                except ValueError as exc:
                    reason = _unreadable(line, exc)
                    head = line[:4096]
            else:
                reason = f"the request is over {self.max_line} bytes"
            request_id = _first_id(head)
            self.refused += 1
            if request_id is None:
                print(f"pexec guard: dropped a host message it cannot read: {reason}", file=sys.stderr, flush=True)
                continue
            name = _NAME.search(head)
            tool = orjson.loads(b'"' + name[1] + b'"') if name else "?"
            params = {"name": REFUSED_TOOL, "arguments": {"tool": tool, "reason": reason}}
            yield orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).decode()


def _unreadable(line: bytes, exc: ValueError) -> str:
    from pipeline.apps.guard.session import RECORD_TOO_DEEP

    text = str(exc)
    if "recursion" in text.lower() or "depth" in text.lower():
        return RECORD_TOO_DEEP
    return "the request is not JSON-RPC: " + text.splitlines()[0][:200] if text else "the request is not JSON-RPC"


class _FileBytes:
    """An anyio async file as a byte stream for LineReader."""

    def __init__(self, file: anyio.AsyncFile[bytes]) -> None:
        self.file = file

    async def receive(self) -> bytes:
        data = await self.file.read(65536)
        if not data:
            raise anyio.EndOfStream
        return data
