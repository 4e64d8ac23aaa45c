"""BFCL v3/v4 multi-turn: replay against the official simulators of the pinned `bfcl-eval` releases.

`bfcl_v3` replays against 2025.8.6.2 (the release that shipped BFCL_v3 data, read from its wheel) and
`bfcl_v4` against the installed release; a rollout's `benchmark` selects the environment. `bfcl_eval` is
imported inside the factory only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.envs._registry import EnvOptions

if TYPE_CHECKING:
    from pipeline.envs.bfcl.env import BfclEnvironment

NAMES = ("bfcl_v3", "bfcl_v4")


def bfcl_v3(options: EnvOptions) -> BfclEnvironment:
    from pipeline.envs.bfcl.env import BfclEnvironment

    return BfclEnvironment("bfcl_v3")


def bfcl_v4(options: EnvOptions) -> BfclEnvironment:
    from pipeline.envs.bfcl.env import BfclEnvironment

    return BfclEnvironment("bfcl_v4")


# What the package exports: its public modules and the names defined here (a `_x.py` module is its own).
__all__ = [
    "NAMES",
    "bfcl_v3",
    "bfcl_v4",
    "calls",
    "env",
    "official",
]
