"""pexec: prefix executability for tool-using agents.

The public API; the implementation lives in the modules named below.
"""

from pipeline.aggregate import BootstrapSettings, QueryRefused, compute_metrics, sql, write_metrics
from pipeline.checker import replay
from pipeline.coverage import RunIncomplete
from pipeline.distributed import plan, run_scoring
from pipeline.envs import Environment, EnvOptions, Outcome, SpecError, ToolInfo, get_environment, register
from pipeline.envs.spec.loader import Spec, load_spec
from pipeline.model import Call, Message, Reject, Rollout, RolloutResult, StepResult
from pipeline.records import InvalidRecord, parse_rollout
from pipeline.storage.stores import write_store
from pipeline.synth import synthesize

__all__ = [
    "BootstrapSettings",
    "Call",
    "EnvOptions",
    "Environment",
    "InvalidRecord",
    "Message",
    "Outcome",
    "QueryRefused",
    "Reject",
    "Rollout",
    "RolloutResult",
    "RunIncomplete",
    "Spec",
    "SpecError",
    "StepResult",
    "ToolInfo",
    "compute_metrics",
    "get_environment",
    "load_spec",
    "parse_rollout",
    "plan",
    "register",
    "replay",
    "run_scoring",
    "sql",
    "synthesize",
    "write_metrics",
    "write_store",
]
