"""One writer per run (docs/explanation/data-model.md, "One writer per run"): a lease object `RUN/_lease.json` that a
scoring driver holds while it writes the run.

The lease names its holder (user, host, pid, start time) and carries a heartbeat that the holder renews in a
background thread. A second writer fails at once naming the holder; a lease whose heartbeat is older than
`stale_after` seconds (a crashed or killed driver), or whose holder ran on this host and is gone, is taken
over, with a warning.

Every change of the lease is a compare-and-swap, so two writers can never both believe they hold it:
- object storage (S3 and S3-compatible servers): conditional requests — create with `If-None-Match: *`,
  renew / take over / release with `If-Match: <ETag>` of the version read;
- a local disk: the read-check-write runs under an exclusive `flock` of the run folder;
- other fsspec filesystems (memory://, gs://…): read-check-write without a lock (best effort).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from fsspec.asyn import sync

from pipeline.core.errors import LeaseHeld, LeaseLost, PexecError, StorageError
from pipeline.storage.fs import StorageOptions, filesystem, is_local

LEASE = "_lease.json"
DEFAULT_STALE_AFTER = 600.0  # seconds without a heartbeat before a lease counts as abandoned
# How long a writer waits for the run folder's lock on a local disk. The lock is held for one read-check-write
# (milliseconds), so a longer wait means its holder is frozen (stopped, swapped out): the wait ends, and the lease
# is judged as read without the lock (it is written aside and renamed, so a read never sees half of it).
LOCK_WAIT = 10.0

log = logging.getLogger(__name__)


# What a compare-and-swap of the lease compares: the holder's token in a lease file, an S3 object's ETag.
Version = str


@dataclass(frozen=True)
class Holder:
    token: str  # unique per acquisition: tells this writer's lease from a takeover's
    owner: str
    host: str
    pid: int
    started_at: str
    heartbeat: float  # Unix time of the last renewal

    def describe(self, now: float) -> str:
        return (
            f"{self.owner}@{self.host} pid {self.pid} (started {self.started_at}, "
            f"last heartbeat {now - self.heartbeat:.0f}s ago)"
        )


def _me() -> Holder:
    try:
        owner = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        owner = str(os.getuid())
    now = time.time()
    return Holder(uuid.uuid4().hex, owner, socket.gethostname(), os.getpid(), datetime.now(UTC).isoformat(), now)


class Lease:
    """`with Lease(run, storage_options): ...` holds the run's lease for the block, renewing it every
    `stale_after / 10` seconds; released on exit, whatever ends the block (an error, Ctrl-C)."""

    def __init__(
        self, run: str, storage_options: StorageOptions | None = None, stale_after: float = DEFAULT_STALE_AFTER
    ) -> None:
        if stale_after <= 0:
            raise PexecError(f"the lease's staleness limit must be > 0 seconds, got {stale_after}")
        self.url = f"{run.rstrip('/')}/{LEASE}"
        self.stale_after = stale_after
        self._object = _object_for(self.url, storage_options)
        self._holder: Holder | None = None
        self._version: Version | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewing = threading.Lock()  # the heartbeat and confirm() must not race on the version

    @contextlib.contextmanager
    def taking(self) -> Iterator[None]:
        """Signals (Ctrl-C, SIGTERM) wait while the lease is taken and its release is registered (enter the lease
        inside this block): one arriving between the lease file's creation and the `with` that releases it
        would otherwise leave the lease behind. Python runs signal handlers in the main thread only; elsewhere
        a no-op. The handlers are swapped rather than the signals blocked: the kernel hands a signal to any
        thread that does not block it (a progress bar's, say), and the main thread then runs its handler."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        received: list[int] = []
        deferred = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]  # None: not ours
        previous = {s: signal.signal(s, lambda signum, _: received.append(signum)) for s in deferred}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for pending in received:
                signal.raise_signal(pending)  # delivered now, to the handlers restored above

    def __enter__(self) -> Lease:
        if self._holder is None:  # not acquired beforehand
            self.acquire()
        self._thread = threading.Thread(target=self._heartbeat, name="pexec-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.release()

    def acquire(self) -> None:
        try:
            self._acquire()
        except PexecError:
            raise
        except Exception as exc:  # the backend's own errors (missing bucket, permissions, network): one line
            raise StorageError(f"cannot take the lease {self.url}: {type(exc).__name__}: {exc}") from exc

    def _acquire(self) -> None:
        try:
            self._take()
        except _LockTimeout:
            run = self.url.rsplit("/", 1)[0]
            current, _ = self._object.read()
            held = f"is being written by {current.describe(time.time())}" if current else "is locked by another writer"
            raise LeaseHeld(
                f"run {run} {held}; it has held the run folder's lock for more than {LOCK_WAIT:.0f}s "
                f"(a stopped process?) ({self.url})"
            ) from None

    def _take(self) -> None:
        me = _me()
        with self._object.locked():
            current, version = self._object.read()
            if current is None:
                new = self._object.create(_dump(me))
            else:
                age = me.heartbeat - current.heartbeat
                if age <= self.stale_after and not _gone(current, me):
                    raise LeaseHeld(
                        f"run {self.url.rsplit('/', 1)[0]} is being written by {current.describe(me.heartbeat)}; "
                        f"its lease is stale after {self.stale_after:.0f}s without a heartbeat ({self.url})"
                    )
                why = "its process is gone" if age <= self.stale_after else "stale"
                log.warning(
                    "taking over the lease of %s (%s): %s",
                    self.url.rsplit("/", 1)[0],
                    why,
                    current.describe(me.heartbeat),
                )
                new = self._object.swap(_dump(me), version)
        if new is None:  # another writer created or took it over between our read and our write
            raise LeaseHeld(f"run {self.url.rsplit('/', 1)[0]}: another writer took the lease just now ({self.url})")
        self._holder, self._version = me, new

    def renew(self) -> None:
        """Move the heartbeat on; LeaseLost when someone else holds the lease now."""
        if self._holder is None:
            raise LeaseLost(f"{self.url}: not held")
        with self._renewing:
            holder = replace(self._holder, heartbeat=time.time())
            with self._object.locked():
                new = self._object.swap(_dump(holder), self._version)
            if new is None:
                raise LeaseLost(f"the lease of {self.url.rsplit('/', 1)[0]} was taken over by another writer")
            self._holder, self._version = holder, new

    @property
    def token(self) -> str | None:
        """What tells this acquisition from any other (None when not held): tasks carry it (`require_holder`)."""
        return self._holder.token if self._holder else None

    def check(self) -> None:
        """Raise LeaseLost if the heartbeat found the lease taken over (cheap: called before each shard)."""
        if self._lost:
            raise LeaseLost(self._lost)

    def confirm(self) -> None:
        """Renew now, or raise LeaseLost: called right before each step that deletes or commits, so that it
        happens only while this writer certainly holds the lease (whatever became of the heartbeat)."""
        self.check()
        try:
            self.renew()
        except _LockTimeout:
            raise LeaseLost(
                f"cannot confirm the lease of {self.url.rsplit('/', 1)[0]}: another process has held the run "
                f"folder's lock for more than {LOCK_WAIT:.0f}s"
            ) from None

    def release(self) -> None:
        if self._holder is None:
            return
        try:
            with self._object.locked():
                self._object.delete(self._version)
        except _LockTimeout:  # left behind: it goes stale, or a rerun on this host takes it over
            log.warning("could not release the lease %s: its folder's lock is held by another process", self.url)
        self._holder = None

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.stale_after / 10):
            try:
                self.renew()
            except LeaseLost as exc:
                self._lost = str(exc)
                return
            except Exception as exc:  # a network blip: the next beat tries again; confirm() is the guard
                log.warning("could not renew the lease %s: %s: %s", self.url, type(exc).__name__, exc)


def require_holder(run: str, token: str, storage_options: StorageOptions | None = None) -> None:
    """Raise LeaseLost unless the acquisition `token` still holds `run`'s lease. A scoring task asks right
    before it writes: a driver that stops (a failed shard, a lost lease, Ctrl-C) leaves its tasks in flight
    running (pipeline.scoring.driver.completed says why), and those then write nothing."""
    run = run.rstrip("/")
    holder, _ = _object_for(f"{run}/{LEASE}", storage_options).read()
    if holder is None:
        raise LeaseLost(f"the lease of {run} was released: its writer stopped")
    if holder.token != token:
        raise LeaseLost(f"the lease of {run} was taken over by another writer")


def _gone(holder: Holder, me: Holder) -> bool:
    """The holder ran on this host and its process no longer exists (killed, out of memory): no need to wait
    for its heartbeat to go stale."""
    if holder.host != me.host or holder.pid <= 0:
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def _flock(fd: int, lease: str) -> None:
    """An exclusive flock of `fd`, waited for at most LOCK_WAIT seconds: a blocking flock would wait forever
    behind a holder that was stopped (SIGSTOP, a debugger) while it held the lock."""
    deadline = time.monotonic() + LOCK_WAIT
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise _LockTimeout(lease) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


class _LockTimeout(Exception):
    """The run folder's lock was not free within LOCK_WAIT: its holder is frozen."""


def _dump(holder: Holder) -> bytes:
    return orjson.dumps(asdict(holder))


def _load(data: bytes) -> Holder | None:
    try:
        return Holder(**orjson.loads(data))
    except (orjson.JSONDecodeError, TypeError):
        return None  # unreadable: treated as abandoned long ago


class _File:
    """The lease as a file: compare-and-swap by token under `locked()` (an flock of the folder on a local
    disk; nothing elsewhere, which makes it best effort there)."""

    def __init__(self, url: str, storage_options: StorageOptions | None) -> None:
        self.fs, self.path = filesystem(url, storage_options)
        self.local = is_local(self.fs)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if not self.local:
            yield
            return
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            _flock(fd, self.path)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def read(self) -> tuple[Holder | None, Version | None]:
        try:
            data = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None, None
        holder = _load(data)
        return (holder or Holder("", "?", "?", 0, "?", 0.0)), (holder.token if holder else "")

    def create(self, data: bytes) -> Version | None:
        if self.fs.exists(self.path):
            return None
        return self._write(data)

    def swap(self, data: bytes, version: Version | None) -> Version | None:
        current, now = self.read()
        if current is None or now != version:
            return None
        return self._write(data)

    def delete(self, version: Version | None) -> None:
        current, now = self.read()
        if current is not None and now == version:
            self.fs.rm_file(self.path)

    def _write(self, data: bytes) -> Version:
        if self.local:  # aside, then renamed over: a reader never sees half a lease
            tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        else:
            self.fs.pipe_file(self.path, data)
        token: str = orjson.loads(data)["token"]  # the holder just written
        return token


class _S3Object:
    """The lease as an S3 object: every change is a conditional request, atomic on the server."""

    def __init__(self, url: str, storage_options: StorageOptions | None) -> None:
        self.fs, path = filesystem(url, storage_options)
        self.bucket, self.key = path.split("/", 1)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        yield  # the server decides

    def read(self) -> tuple[Holder | None, Version | None]:
        try:
            response = self.fs.call_s3("get_object", Bucket=self.bucket, Key=self.key)
        except FileNotFoundError:
            return None, None
        data = sync(self.fs.loop, response["Body"].read)  # aiobotocore's body is async
        etag: Version = response["ETag"]
        return (_load(data) or Holder("", "?", "?", 0, "?", 0.0)), etag

    def create(self, data: bytes) -> Version | None:
        return self._put(data, IfNoneMatch="*")

    def swap(self, data: bytes, version: Version | None) -> Version | None:
        return self._put(data, IfMatch=version)

    def delete(self, version: Version | None) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._conditional("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=version)

    def _put(self, data: bytes, **condition: str | None) -> Version | None:
        response = self._conditional("put_object", Bucket=self.bucket, Key=self.key, Body=data, **condition)
        return None if response is None else response["ETag"]

    def _conditional(self, method: str, **kwargs: Any) -> dict[str, Any] | None:
        """botocore's response (untyped JSON), or None when the condition failed (someone else changed the object
        first)."""
        try:
            response: dict[str, Any] = self.fs.call_s3(method, **kwargs)
            return response
        except OSError as exc:
            cause = getattr(exc.__cause__, "response", None) or {}
            if cause.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return None
            raise


def _object_for(url: str, storage_options: StorageOptions | None) -> _File | _S3Object:
    fs, _ = filesystem(url, storage_options)
    return _S3Object(url, storage_options) if "s3" in fs.protocol else _File(url, storage_options)
