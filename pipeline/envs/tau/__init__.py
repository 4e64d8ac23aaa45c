"""τ³-bench airline, retail, telecom and banking_knowledge (`tau_airline`, `tau_retail`, `tau_telecom`,
`tau_banking_knowledge`) over the official tool code.

Only the factories live here: the official package is imported when an environment is built, so the rest
of the project imports without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.errors import EnvError
from pipeline.envs._registry import EnvOptions

if TYPE_CHECKING:
    from pipeline.envs.tau.banking import BankingEnvironment
    from pipeline.envs.tau.env import TauEnvironment
    from pipeline.envs.tau.telecom import TelecomEnvironment


def _build(domain: str, options: EnvOptions) -> TauEnvironment:
    from pipeline.envs.tau._rules import load_rules
    from pipeline.envs.tau.env import TauEnvironment

    return TauEnvironment(domain, load_rules(domain), strict=options.policy == "strict")


def tau_airline(options: EnvOptions) -> TauEnvironment:
    return _build("airline", options)


def tau_retail(options: EnvOptions) -> TauEnvironment:
    return _build("retail", options)


def tau_telecom(options: EnvOptions) -> TelecomEnvironment:
    from pipeline.envs.tau._rules import load_rules
    from pipeline.envs.tau.telecom import TelecomEnvironment

    if options.policy == "strict":
        raise EnvError("tau_telecom has no written-policy overlay: score it with --policy code")
    return TelecomEnvironment(load_rules("telecom"))


def tau_banking_knowledge(options: EnvOptions) -> BankingEnvironment:
    from pipeline.envs.tau.banking import BankingEnvironment

    if options.policy == "strict":
        raise EnvError("tau_banking_knowledge has no written-policy overlay: score it with --policy code")
    return BankingEnvironment()


# What the package exports: its public modules and the names defined here (a `_x.py` module is its own).
__all__ = [
    "banking",
    "env",
    "tau_airline",
    "tau_banking_knowledge",
    "tau_retail",
    "tau_telecom",
    "telecom",
]
