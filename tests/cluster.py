"""A real Ray cluster on loopback for tests, started and stopped by the script developers use
(infra/local/ray-head.sh), and what its processes listen on."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from conftest import ROOT, free_port

BIN = Path(sys.executable).parent
SCRIPT = str(ROOT / "infra/local/ray-head.sh")


@dataclass
class LocalCluster:
    tmp: str  # Ray's temp dir (short: socket paths are limited)
    gcs_port: int
    address: str  # the Jobs API
    head_cpus: int = 2
    client_port: int = field(default_factory=free_port)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PEXEC_RAY_TMP": self.tmp,
            "PEXEC_RAY": str(BIN / "ray"),
            "PYTHONPATH": str(ROOT),  # the image's installed package, for jobs run with runtime `image`
            "RAY_ADDRESS": "",
            "RAY_API_SERVER_ADDRESS": "",
            # An in-process ray.init (earlier tests) leaves RAY_AUTH_MODE=token in os.environ: the loopback head
            # runs without token auth, as infra/local/ray-head.sh starts it by default.
            "RAY_AUTH_MODE": "disabled",
            "PEXEC_HEAD_CPUS": str(self.head_cpus),
            "PEXEC_RAY_CLIENT_PORT": str(self.client_port),
            # A node that stops answering is declared dead after 3 missed checks of 0.5 s (Ray's default: 5 of
            # 3 s): the node-failure tests wait for that, and nothing else on loopback misses a check.
            "RAY_health_check_period_ms": "500",
            "RAY_health_check_failure_threshold": "3",
        }

    def script(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", SCRIPT, *args], env=self.env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def sessions(self) -> list[int]:
        path = Path(self.tmp) / "pexec-sessions"
        return [int(s) for s in path.read_text().split()] if path.exists() else []

    def pids(self) -> list[int]:
        """Every live process of the sessions the script started."""
        return session_pids(set(self.sessions()))


def session_pids(sessions: set[int]) -> list[int]:
    """The live (not zombie) processes of these sessions."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if os.getsid(int(entry)) in sessions and state != "Z":
                    found.append(int(entry))
            except (OSError, IndexError):
                pass
    return found


def start_cluster(head_cpus: int = 2, workers: int = 0) -> LocalCluster:
    dashboard = free_port()
    cluster = LocalCluster(tempfile.mkdtemp(prefix="pxr", dir="/tmp"), free_port(), f"http://127.0.0.1:{dashboard}")
    cluster.head_cpus = head_cpus
    try:
        cluster.script("start", str(cluster.gcs_port), str(dashboard))
        for _ in range(workers):
            cluster.script("worker", str(cluster.gcs_port))
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: LocalCluster) -> None:
    subprocess.run(["bash", SCRIPT, "stop"], env=cluster.env, capture_output=True, timeout=60)
    shutil.rmtree(cluster.tmp, ignore_errors=True)


def listening(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, protocol, local address) of every listening TCP socket and bound UDP socket the processes hold,
    read from /proc: each socket's inode in /proc/PID/fd, its address in /proc/net/{tcp,tcp6,udp,udp6}."""
    sockets: dict[str, tuple[str, str]] = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/net/{proto}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if proto.startswith("udp") or state == "0A":  # 0A: LISTEN
                    sockets[inode] = (proto, _address(local))
    found = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in sockets:
                found.append((pid, *sockets[link[8:-1]]))
    return found


def _address(hex_address: str) -> str:
    ip, port = hex_address.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        host = ".".join(str(b) for b in reversed(raw))
    else:  # IPv6: four little-endian 32-bit words
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        host = str(ipaddress.IPv6Address(b"".join(words)))
        mapped = ipaddress.IPv6Address(host).ipv4_mapped
        host = str(mapped) if mapped else host
    return f"{host}:{int(port, 16)}"
