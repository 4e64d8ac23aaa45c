"""Waiting on Ray without waiting for ever: every wait of the driver also watches this machine's Ray node.

When the raylet of the driver's own node dies (killed, or out of memory), Ray 2.60 does not fail the driver's
`ray.get` or `ray.wait`: a wait on an object that node held, or on a task it was running, lasts for ever, and a
nightly run would hang instead of exiting. Only the GCS notices, once its health checks of the node have missed
(about 17 s after the raylet stopped, on this project's machines). So each wait here is cut into slices of at most
CHECK_S seconds, and between slices the GCS is asked whether the node is alive; once it says not, the wait raises
RayNodeLost. A dead GCS needs no watch: Ray ends the driver itself when it cannot reach its GCS for 60 s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pipeline.core.errors import RayNodeLost

__all__ = ["CHECK_S", "NodeWatch", "get", "wait"]

CHECK_S = 5.0  # the longest a wait goes without asking whether this machine's Ray node is alive


class NodeWatch:
    """Asks the GCS whether the driver's Ray node is alive, at most once every CHECK_S seconds."""

    def __init__(self) -> None:
        self._next = time.monotonic() + CHECK_S
        self._node: str | None = None

    def check(self) -> None:
        """Raise RayNodeLost if the GCS has declared this process's node dead (asked once every CHECK_S)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + CHECK_S
        import ray

        if not any(n["NodeID"] == self._node_id() and n["Alive"] for n in ray.nodes()):
            raise self.lost()

    def lost(self) -> RayNodeLost:
        return RayNodeLost(
            f"Ray's node on this machine ({self._node_id()[:12]}) died while pexec waited on it (its raylet"
            " stopped: killed, or out of memory?); nothing of this step was committed"
        )

    def _node_id(self) -> str:
        if self._node is None:
            import ray

            self._node = ray.get_runtime_context().get_node_id()
        return self._node


def wait(refs: Sequence[Any], num_returns: int = 1, watch: NodeWatch | None = None) -> tuple[list[Any], list[Any]]:
    """`ray.wait(refs, num_returns=num_returns)` with no timeout, raising RayNodeLost instead of waiting for ever
    once this machine's node is declared dead."""
    import ray

    watch = watch or NodeWatch()
    while True:
        done, pending = ray.wait(list(refs), num_returns=num_returns, timeout=CHECK_S)
        if len(done) >= num_returns:
            return done, pending
        watch.check()


def get(refs: Any, watch: NodeWatch | None = None) -> Any:
    """`ray.get(refs)` (one ObjectRef or a list of them), raising RayNodeLost instead of waiting for ever once
    this machine's node is declared dead, or when Ray says a task failed because it did."""
    import ray

    watch = watch or NodeWatch()
    distinct = list(dict.fromkeys(refs if isinstance(refs, list) else [refs]))  # ray.wait refuses repeats
    if distinct:
        wait(distinct, num_returns=len(distinct), watch=watch)
    try:
        return ray.get(refs)
    except ray.exceptions.LocalRayletDiedError as exc:
        raise watch.lost() from exc
