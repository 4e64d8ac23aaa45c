"""How pexec starts (or joins) Ray: one call every stage uses, so each start is configured and quiet alike."""

from __future__ import annotations

import logging
import os

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


def start_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Join the Ray at `address`, or start one in this process (None) with `num_cpus` CPUs (None: all); nothing
    when this process already has one."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    notice, logger = _TokenAuthNotice(), logging.getLogger(_TOKEN_AUTH_LOGGER)
    logger.addFilter(notice)
    try:
        ray.init(
            address=address,
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    finally:
        logger.removeFilter(notice)
