"""`observed`: for logs that come with no simulator.

S is checked against a spec's schemas when one is given (otherwise any well-formed call passes S),
D as usual, and P is decided by the logged outcome: `error: true` means the backend rejected the call.
Outputs are the logged ones, so downstream references and grounding see what the agent saw.
"""

from __future__ import annotations

from typing import Any

from pipeline.envs import EnvOptions, register
from pipeline.envs.base import Outcome, ToolInfo
from pipeline.model import NOT_LOGGED, Call, Rollout
from pipeline.specs import find_spec, load_spec


class ObservedEnvironment:
    name = "observed"
    simulated = False

    def __init__(self, tools: dict[str, ToolInfo] | None = None, spec_version: str = "") -> None:
        self._tools = tools
        self.version = f"observed+{spec_version}" if spec_version else "observed"

    def tool(self, name: str) -> ToolInfo | None:
        if self._tools is None:
            return None
        return self._tools.get(name)

    def open_catalogue(self) -> bool:
        return self._tools is None

    def start(self, rollout: Rollout) -> None:
        return None

    def available(self, state: None, tool: str, turn: int) -> bool:
        return True

    def execute(self, state: None, tool: str, args: dict[str, Any], call: Call) -> Outcome:
        output = None if call.output is NOT_LOGGED else call.output
        if call.error:
            return Outcome(False, message=str(output) if output is not None else "logged error", decided_by="log")
        return Outcome(True, output=output, decided_by="log")

    def checkpoint(self, state: None) -> None:
        return None

    def rollback(self, state: None, mark: None) -> None:
        return None


@register("observed")
def _observed(options: EnvOptions) -> ObservedEnvironment:
    if options.spec is None:
        return ObservedEnvironment()
    from pipeline.envs import EnvError

    folder = find_spec(options.spec, options.spec_dirs)
    if folder is None:
        raise EnvError(f"observed: no spec named {options.spec!r}")
    spec = load_spec(folder)
    return ObservedEnvironment({n: r.info for n, r in spec.tools.items()}, f"{spec.name}@{spec.version}")
