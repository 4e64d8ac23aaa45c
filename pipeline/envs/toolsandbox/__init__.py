"""ToolSandbox (apple/ToolSandbox) local tools, `toolsandbox`: a native simulator written from upstream's
behaviour (upstream is not on PyPI). The RapidAPI tools are out of scope: they are not in the catalogue,
so a call to one is an S failure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.envs._registry import EnvOptions

if TYPE_CHECKING:
    from pipeline.envs.toolsandbox.env import ToolSandboxEnvironment


def toolsandbox(options: EnvOptions) -> ToolSandboxEnvironment:
    # Imported when the environment is built, for start-up cost only (the simulator and the libraries of its tool
    # bodies, ~0.1 s): the registry imports this module to find the factory, and most runs score none of this one.
    from pipeline.envs.toolsandbox.env import ToolSandboxEnvironment

    return ToolSandboxEnvironment()


# What the package exports: its public modules and the names defined here (a `_x.py` module is its own).
__all__ = [
    "env",
    "toolsandbox",
]
