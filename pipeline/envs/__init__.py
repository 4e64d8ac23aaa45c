"""Environments: the protocol (base.py), the registry that resolves a name to one (_registry.py), the rule
engine of the rule-based families (_rules.py), and one module or folder per family: observed, spec/,
bfcl/, tau/, toolsandbox/, each imported when one of its environments is first built. README.md here says how
to add a family.

Imports: core, expr.
"""

from __future__ import annotations

from pipeline.core.errors import EnvError, SpecError
from pipeline.envs._registry import (
    EnvOptions,
    forget_unresolved,
    get_environment,
    list_environments,
    new_environment,
    register,
)
from pipeline.envs.base import Environment, Outcome, ToolInfo

__all__ = [
    "EnvError",
    "EnvOptions",
    "Environment",
    "Outcome",
    "SpecError",
    "ToolInfo",
    "forget_unresolved",
    "get_environment",
    "list_environments",
    "new_environment",
    "register",
]
