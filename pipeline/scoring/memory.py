"""A process's peak resident memory, as a scoring task reports it in its shard's marker and the benches read it.

The peak is the kernel's VmHWM (/proc/PID/status), which a program starts afresh at exec. `ru_maxrss` is not used:
Linux carries it across fork and exec, so a Ray worker's would start at the raylet's peak, and a child's at its
parent's. A Ray worker runs many tasks one after another; a task that restarts the peak as it begins
(`restart_peak`, /proc/self/clear_refs) reports its own, not the largest of every task the worker ran before.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path


def peak_mib(pid: int | str = "self") -> float:
    """The peak RSS of process `pid` (this one by default), its VmHWM, in MiB. ProcessLookupError for a process
    that has exited, a zombie included: its status has no memory lines left. Where there is no /proc (not Linux),
    this process's `ru_maxrss`, its peak since it started."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        if pid != "self" or Path("/proc/self").exists():
            raise ProcessLookupError(f"process {pid} has exited") from None
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ProcessLookupError(f"process {pid} has exited: no VmHWM in its status")


def restart_peak() -> bool:
    """Start this process's VmHWM afresh from its current resident memory (Linux 4.0 and later). False where the
    kernel does not allow it: the peak then stays the process's since it started."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
