"""What benches share about processes: a local S3-compatible server (moto, infra/local/s3-server.sh) for the
duration of a measurement, and the CPU time, load average and niceness of what a measurement ran. A process's
peak memory is read as scoring tasks read their own (`pipeline.scoring.memory`: VmHWM, never ru_maxrss).

CPU time of a single process is read from /proc too: it and every live descendant, each with what its reaped
children used (utime + stime + cutime + cstime), read before Ray stops, while Ray's workers live. A whole measured
block (`metered`) is counted by the kernel instead, in a cgroup of its own that every process started in it joins:
the raylet reaps its workers without adding their time to anyone's, so once a driver that started a Ray has exited
no process tree holds its workers' time. Where no cgroup can be made (not root), the block falls back to the tree,
with this process the subreaper of the tree's orphans (Linux's PR_SET_CHILD_SUBREAPER: an orphan becomes its
child instead of init's and, once dead, waits as a zombie, its times readable, until the block reaps it), and says
so.

Ray starts its workers at nice 15 (Ray's `worker_niceness`) while a baseline runs at the niceness of the bench:
`BENCH_ENVIRONMENT` starts them at 0, the same as every other measured process, and `Usage` says what niceness it
saw.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.apps.perf import require_dev
from pipeline.apps.perf.figures import Usage

ROOT = Path(__file__).resolve().parents[3]
BENCH_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_RAY_AGENTS = ("ray::RuntimeEnv", "ray::DashboardA")  # the raylet's agents, as /proc names them (15 characters)
# Ray workers at the niceness of every other measured process (Ray's default: 15, behind a baseline at 0).
BENCH_ENVIRONMENT = {"RAY_worker_niceness": "0"}


@dataclass(frozen=True)
class _Stat:
    ppid: int
    cpu_s: float  # user + system, its reaped children's included
    nice: int
    ray_worker: bool  # a Ray worker (named `ray::IDLE`, `ray::<task>`) rather than one of Ray's services
    zombie: bool = False  # dead, not yet reaped: its times are final


def _stat(pid: str) -> _Stat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone since the listing
        return None
    name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(v) for v in rest[11:15])
    worker = name.startswith("ray::") and name not in _RAY_AGENTS
    return _Stat(int(rest[1]), (utime + stime + cutime + cstime) / _TICKS, int(rest[16]), worker, rest[0] == "Z")


def process_tree(pid: int | None = None) -> dict[int, _Stat]:
    """Process `pid` (this one by default) and its live descendants, read from /proc."""
    root = os.getpid() if pid is None else pid
    stats = {int(p.name): s for p in Path("/proc").iterdir() if p.name.isdigit() and (s := _stat(p.name))}
    children: dict[int, list[int]] = {}
    for child, s in stats.items():
        children.setdefault(s.ppid, []).append(child)
    tree, todo = {}, [root]
    while todo:
        at = todo.pop()
        if at in stats:
            tree[at] = stats[at]
            todo += children.get(at, [])
    return tree


def cpu_seconds(pid: int | None = None) -> float:
    """CPU-seconds (user + system) used so far by process `pid` (this one by default), its live descendants and
    every child any of them reaped: Ray's processes included while Ray runs."""
    return sum(s.cpu_s for s in process_tree(pid).values())


@contextmanager
def counting() -> Iterator[Callable[[], float]]:
    """For the block of a measured process: a function that gives the CPU-seconds so far of this process since it
    started and of every process started in the block, Ray's included, ended or not. Counted by the kernel in a
    cgroup of the block's own; where none can be made, `cpu_seconds()` (which misses Ray's ended workers).
    `counted_by()` says which."""
    with _CpuGroup.entered() as group:
        if group is None:
            yield cpu_seconds
            return
        user, system, *_ = os.times()
        before = group.cpu_seconds() - user - system  # this process's time before it joined counts too
        yield lambda: group.cpu_seconds() - before


def counted_by() -> str:
    """How `counting` counts here: "cgroup" or "tree" (found by making, and leaving, a cgroup)."""
    with _CpuGroup.entered() as group:
        return "cgroup" if group is not None else "tree"


COUNTED_BY = {
    "cgroup": "counted by the kernel in a cgroup of its own, so Ray's ended workers are in",
    "tree": "read from its process tree, which misses Ray's ended workers",
}


@dataclass
class Meter:
    """Measures a block (`with metered() as meter:`): after it, `meter.usage`."""

    every: float = 1.0  # seconds between samples of the load average and of the processes' niceness
    usage: Usage | None = None
    _load: list[float] = field(default_factory=list)
    _nice: set[int] = field(default_factory=set)
    _worker_nice: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> float:
        """Record the load average and the tree's niceness; the tree's CPU-seconds so far."""
        self._load.append(os.getloadavg()[0])
        tree = process_tree()
        for s in tree.values():
            (self._worker_nice if s.ray_worker else self._nice).add(s.nice)
        return sum(s.cpu_s for s in tree.values())

    def _sampling(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()


@contextmanager
def metered(every: float = 1.0) -> Iterator[Meter]:
    """Wall time, CPU-seconds, load average and niceness of the block. The CPU-seconds are those of every process
    started in the block, Ray's included, counted by the kernel in a cgroup of the block's own where this process
    may make one (root, cgroup v2 or v1's cpuacct); elsewhere read from the process tree, with this process the
    subreaper of the tree's orphans, which misses a process whose parent ignores its children (Ray's workers,
    reaped by the raylet)."""
    meter = Meter(every)
    reaping = _subreaper(True)
    with _CpuGroup.entered() as group:
        cpu, began = meter.sample(), time.perf_counter()
        sampler = threading.Thread(target=meter._sampling, name="bench-meter", daemon=True)
        sampler.start()
        try:
            yield meter
        finally:
            meter._stop.set()
            sampler.join()
            cpu = meter.sample() - cpu if group is None else group.cpu_seconds()
            meter.usage = Usage(time.perf_counter() - began, cpu, tuple(meter._load), tuple(sorted(meter._nice)),
                                tuple(sorted(meter._worker_nice)), "cgroup" if group else "tree")  # fmt: skip
            if reaping:
                _subreaper(False)
                _reap_orphans()


@dataclass(frozen=True)
class _CpuGroup:
    """A cgroup of this process's own, which every process it starts joins: the kernel counts their CPU time
    whatever becomes of them (cgroup v2's cpu.stat, else v1's cpuacct.usage)."""

    folder: Path
    home: Path  # the cgroup this process came from, where it and what is left go back
    usage: str  # the file that holds the group's CPU time
    scale: float  # its unit in seconds

    @classmethod
    @contextmanager
    def entered(cls) -> Iterator[_CpuGroup | None]:
        group = cls._made()
        try:
            yield group
        finally:
            if group is not None:
                group._left()

    @classmethod
    def _made(cls) -> _CpuGroup | None:
        for mount, name, usage, scale in _CGROUPS:
            home = _cgroup_of_self(name)
            if home is None or not (mount / usage).exists():
                continue
            here = mount / home.lstrip("/")
            group = cls(here / f"pexec-bench-{os.getpid()}", here, usage, scale)
            try:
                group.folder.mkdir()
                (group.folder / "cgroup.procs").write_text(str(os.getpid()))
                return group
            except OSError:  # not root, or a hierarchy this process may not write
                with contextlib.suppress(OSError):
                    group.folder.rmdir()
        return None

    def cpu_seconds(self) -> float:
        text = (self.folder / self.usage).read_text()
        value = text.split()[1] if self.usage == "cpu.stat" else text  # cpu.stat starts `usage_usec N`
        return int(value) * self.scale

    def _left(self) -> None:
        """Back home, with every survivor (a Ray still stopping), and the group removed: tried for up to 5 s, as a
        process that is exiting keeps its group busy until it is gone."""
        for _ in range(50):
            with contextlib.suppress(OSError):
                for group in sorted(self.folder.rglob("cgroup.procs"), key=lambda p: -len(p.parts)):
                    for pid in group.read_text().split():  # this process, survivors, a step's own group's
                        with contextlib.suppress(OSError):
                            (self.home / "cgroup.procs").write_text(pid)
                    group.parent.rmdir()  # the deepest first: a step's group left behind, then this one
                return
            time.sleep(0.1)


# cgroup v2 (the unified hierarchy, alone or beside v1), then v1's cpuacct: mount, name in /proc/self/cgroup, the
# file of the group's CPU time and its unit.
_CGROUPS = (
    (Path("/sys/fs/cgroup"), "", "cpu.stat", 1e-6),
    (Path("/sys/fs/cgroup/unified"), "", "cpu.stat", 1e-6),
    (Path("/sys/fs/cgroup/cpuacct"), "cpuacct", "cpuacct.usage", 1e-9),
)


def _cgroup_of_self(name: str) -> str | None:
    """This process's cgroup in the hierarchy `name` ("" for v2) from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if name in controllers.split(",") if name else controllers == "":
            return path
    return None


def _subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants' orphans (or stop); False where Linux's prctl is not."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _reap_orphans() -> None:
    """Reap the dead orphans the block adopted. Only zombies are waited for, so a live child is never taken from
    the code that started it; by the block's end the bench has waited for every process it started."""
    me = os.getpid()
    for pid, s in process_tree().items():
        if s.zombie and s.ppid == me:
            with contextlib.suppress(ChildProcessError):  # reaped meanwhile by whoever started it
                os.waitpid(pid, os.WNOHANG)


def free_port() -> int:
    """A loopback port nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server(port: int | None = None, needed_by: str = "this bench") -> Iterator[str]:
    """A moto S3 server on loopback for the block's duration: yields its endpoint URL, with bench credentials
    in the environment (inherited by the processes the bench starts); the server's process group is killed on
    the way out, whatever happened."""
    require_dev("moto", f"the S3 server of {needed_by} (infra/local/s3-server.sh)")
    os.environ.update(BENCH_CREDENTIALS)
    port = port or free_port()
    server = subprocess.Popen(["bash", str(ROOT / "infra/local/s3-server.sh"), str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def wait_for_port(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the S3 server on port {port} did not start within {seconds:g} s")


@contextmanager
def local_ray(cpus: int) -> Iterator[str]:
    """A local Ray of `cpus` CPUs for the block, stopped after it; yields its GCS address (for drivers in other
    processes). A Ray this process already runs (a test's, shared by the smoke runs) is used as it is and left
    running: its CPUs are then its own, not `cpus`, so such a run exercises the code paths and measures nothing."""
    import ray

    from pipeline.core.ray_start import start_ray

    started = not ray.is_initialized()
    if started:
        start_ray(None, cpus)  # as `pexec score` starts it: the benches measure the product's own Ray
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        if started:
            ray.shutdown()
