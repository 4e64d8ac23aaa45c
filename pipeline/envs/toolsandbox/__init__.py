"""ToolSandbox (apple/ToolSandbox) local tools, `toolsandbox`: a native simulator written from upstream's
behaviour (upstream is not on PyPI). The RapidAPI tools are out of scope: they are not in the catalogue,
so a call to one is an S failure."""

from __future__ import annotations

from pipeline.envs.registry import EnvOptions, register


@register("toolsandbox")
def _toolsandbox(options: EnvOptions):
    # Imported when the environment is built, for start-up cost only (the simulator and the libraries of
    # its tool bodies, ~0.1 s): importing pipeline.envs registers every family, and most runs score none of this one.
    from pipeline.envs.toolsandbox.env import ToolSandboxEnvironment

    return ToolSandboxEnvironment()
