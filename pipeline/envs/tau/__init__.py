"""τ³-bench airline and retail (`tau_airline`, `tau_retail`) over the official tool code.

Only the factories live here: the official package is imported when an environment is built, so the rest
of the project imports without it.
"""

from __future__ import annotations

from pipeline.envs.registry import EnvOptions, register


def _build(domain: str, options: EnvOptions):
    from pipeline.envs.tau.env import TauEnvironment
    from pipeline.envs.tau.rules import load_rules

    return TauEnvironment(domain, load_rules(domain), strict=options.policy == "strict")


@register("tau_airline")
def _airline(options: EnvOptions):
    return _build("airline", options)


@register("tau_retail")
def _retail(options: EnvOptions):
    return _build("retail", options)
