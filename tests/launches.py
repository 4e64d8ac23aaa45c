"""What a running test starts, seen from its processes: a Ray node, a server process or a browser.

tests/conftest.py declares by markers what each test starts; this is how it checks the declaration. A thread
of the pytest process (of each xdist worker) looks at the processes below it a few times a second while a test
runs, and once more when each phase of the test ends. A process that was not there when the test began is

- Ray, if it is Ray's GCS server or raylet (every start of a node launches one, whether by `ray.init` in this
  process, `ray start`, or a `pexec score` the test runs) or the `ray start` command itself;
- a browser, if it is chromium (however launched: by the test or by Playwright's driver);
- a server, if it holds a listening TCP socket and is neither of the above: `pexec view`, `pexec guard serve`,
  moto, a trace server. A short command the test runs (`pexec metrics …`) listens on nothing.

Ray's own processes and a browser's are not looked into further (a new worker of a Ray that a previous test
started is not a new Ray). Linux only: it reads /proc. A process that lives less than one look (0.2 s) may be
missed; every Ray, server and browser of this suite lives seconds.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

WATCHED = ("ray", "server", "browser")
INTERVAL_S = 0.2
RAY_NODE_PROGRAMS = ("gcs_server", "raylet")  # /proc/PID/comm of a Ray node's first processes


def children(pid: int) -> list[int]:
    """The processes `pid` started (the kernel's list per thread of it); none once it has ended."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            found.extend(int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    except OSError:  # the process or thread ended while being read
        pass
    return found


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class Process:
    pid: int
    program: str  # /proc/PID/comm: the executable's name, as Ray's processes also retitle themselves ("ray::…")
    command: tuple[str, ...]

    @classmethod
    def read(cls, pid: int) -> Process:
        command = tuple(arg for arg in _read(f"/proc/{pid}/cmdline").split("\0") if arg)
        return cls(pid, _read(f"/proc/{pid}/comm").strip(), command)

    def kind(self) -> str | None:
        """What the process is: Ray starting a node ("ray"), another of Ray's processes ("ray-process"), a browser
        ("browser"), or anything else (None)."""
        if self.program in RAY_NODE_PROGRAMS:
            return "ray"
        words = [os.path.basename(arg) for arg in self.command[:3]]
        if "ray" in words and "start" in self.command:
            return "ray"
        first = self.command[0] if self.command else ""
        if first.startswith("ray::") or any(f"{os.sep}ray{os.sep}" in arg for arg in self.command):
            return "ray-process"  # a worker, the dashboard, a log monitor…: part of a Ray someone started
        if self.program.startswith("chrom") or self.program == "headless_shell":
            return "browser"
        return None

    def shown(self) -> str:
        text = " ".join(os.path.basename(arg) if i == 0 else arg for i, arg in enumerate(self.command[:4]))
        return f"`{text or self.program}{' …' if len(self.command) > 4 else ''}` (pid {self.pid})"


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets `pid` holds open."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def listening_inodes() -> set[str]:
    """The inodes of every listening TCP socket (IPv4 and IPv6) of this network namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(table).splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # st 0A is LISTEN
                inodes.add(fields[9])
    return inodes


def serves(pid: int, inodes: set[str], listening: set[str]) -> bool:
    """Whether the process, holding sockets `inodes`, listens on one, and is not a Ray driver (`pexec score`,
    `pexec metrics --address`: Ray's core library, loaded, listens for Ray's own calls); False once it has ended."""
    if not inodes & listening:
        return False
    maps = _read(f"/proc/{pid}/maps")
    return bool(maps) and "_raylet" not in maps


@dataclass
class Watch:
    """One test's watch: the kinds looked for, the processes there before the test began, what was found."""

    looked_for: frozenset[str]
    before: frozenset[int] = frozenset()
    known: dict[int, Process] = field(default_factory=dict)  # the processes read so far that are Ray's or a browser
    found: dict[str, str] = field(default_factory=dict)  # kind -> the first such process, as shown


class Launches:
    """The watching thread of this process and the test it watches (one at a time, as pytest runs them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._own_command = Process.read(os.getpid()).command  # a child with it has not run its program yet

    def begin(self, looked_for: set[str]) -> None:
        """Watches for these kinds (of WATCHED) until `end`."""
        watch = Watch(frozenset(looked_for & set(WATCHED)))
        if not watch.looked_for:
            return
        watch.before = frozenset(self._below(watch))
        with self._lock:
            self._watch = watch
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pexec-launches", daemon=True)
            self._thread.start()

    def found(self) -> dict[str, str]:
        """What the watched test started so far, of the kinds looked for: kind -> a process, as shown."""
        self._look()
        with self._lock:
            return dict(self._watch.found) if self._watch else {}

    def end(self) -> None:
        with self._lock:
            self._watch = None

    def _run(self) -> None:
        while True:
            time.sleep(INTERVAL_S)
            self._look()

    def _look(self) -> None:
        with self._lock:
            watch = self._watch
            if watch is None:
                return
            new = [process for pid, process in self._below(watch).items() if pid not in watch.before]
            # A server binds its port once it has started: a new process of no other kind is looked at each time.
            held = {p.pid: socket_inodes(p.pid) for p in new if p.kind() is None and "server" in watch.looked_for}
            listening = listening_inodes() if any(held.values()) else set()
            for process in new:
                kind = process.kind()
                if kind is None and serves(process.pid, held.get(process.pid, set()), listening):
                    kind = "server"
                if kind in watch.looked_for:
                    watch.found.setdefault(kind, process.shown())

    def _below(self, watch: Watch) -> dict[int, Process]:
        """Every process below this one that has started its own program, not looking into Ray's processes nor
        a browser's (their workers and helpers come and go)."""
        below: dict[int, Process] = {}
        todo = [os.getpid()]
        while todo:
            for pid in children(todo.pop()):
                process = watch.known.get(pid) or Process.read(pid)
                if not process.command or process.command == self._own_command:
                    continue  # ended, or not yet running a program of its own: looked at again next time
                below[pid] = process
                if process.kind() is None:
                    todo.append(pid)  # read again next time: it may yet run another program (exec)
                else:
                    watch.known[pid] = process
        return below
