"""How pexec starts (or joins) Ray: one call every stage uses, so each start is configured and quiet alike.

A local Ray is started with what scoring uses and on loopback only: no dashboard (its API server still starts with
only its usage-stats module, which `RAY_USAGE_STATS_ENABLED=0` keeps silent), no usage report, and every service
(GCS, raylet, object manager, workers, the raylet's agents) bound to 127.0.0.1 rather than the machine's address, so
nothing of an embedded cluster is reachable from the network. In Ray 2.60 the raylet refuses to start without its
dashboard agent and runtime-env agent, and `ray.init` always starts the autoscaler monitor and the log monitor:
those stay (docs/reference/benchmarks.md: what the start costs, and the input below which `pexec score` does not
start Ray at all).
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["start_ray"]

# Ray 2.60 logs, at WARNING, on every `ray.init()` that starts a local cluster (so on every local score), that
# token authentication is on by default. It reports a secure default, not a fault: the embedded cluster lives and
# dies with this process. Only that notice is dropped; its opposite (authentication *off*) and every other Ray
# warning still show.
_TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_AUTH_ON = "Token authentication is enabled for this Ray cluster"


class _TokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_AUTH_ON)


LOOPBACK = "127.0.0.1"
_THIS_HOST_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def start_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Join the Ray at `address` (or $RAY_ADDRESS), or start one in this process (None) with `num_cpus` CPUs
    (None: all), on loopback; nothing when this process already has one."""
    local = address is None and not os.environ.get("RAY_ADDRESS")  # ray.init joins $RAY_ADDRESS when it is set
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        # Ray takes 127.0.0.1 for the machine's external address unless this says the cluster is this host; read
        # when Ray is first imported, and by Ray's processes, which inherit it.
        os.environ.setdefault(_THIS_HOST_ONLY, "0")
    import ray

    if ray.is_initialized():
        return
    notice, logger = _TokenAuthNotice(), logging.getLogger(_TOKEN_AUTH_LOGGER)
    logger.addFilter(notice)
    loopback: dict[str, Any] = {"_node_ip_address": LOOPBACK} if local else {}  # one of ray.init's **kwargs
    try:
        ray.init(
            address=address,
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            logging_level=logging.WARNING,
            **loopback,
        )
    finally:
        logger.removeFilter(notice)
