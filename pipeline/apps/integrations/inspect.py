"""An Inspect AI scorer that replays a sample's tool calls: prefix executability from inside an Inspect eval.

    from pipeline.apps.integrations.inspect import executability
    Task(dataset=..., solver=[use_tools(...), generate()], scorer=executability(env="observed", spec="support"))

The sample's messages become a rollout exactly as `pexec ingest inspect` maps a logged sample
(pipeline.ingest.inspect.sample_record), and the rollout is replayed by the batch scorer's checker
(pipeline.replay.checker.replay), so a score here equals `pexec ingest inspect` + `pexec score` of the eval's log.
Each score's value holds the rollout's `fed`, `T`, `executable` and `auc_term`; its metadata one entry per call
(step, tool, valid, failed check, cause, the environment's message). `ter()` and `auc_pec()` are the means over
every scored sample and epoch (each epoch is a rollout, as in pexec). A sample that Inspect halted with an error
is not scored by Inspect; pexec counts it as a harness error, outside the metrics, the same population.

Needs `inspect_ai` installed (it is not a dependency of pexec).
"""

from __future__ import annotations

from typing import Any, TypedDict

from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, metric, scorer
from inspect_ai.solver import TaskState

from pipeline.core.model import RolloutResult, StepResult
from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest.inspect import sample_record
from pipeline.replay.checker import CHECKS, replay


@metric(scores="unreduced")
def ter() -> Metric:
    """TER: the share of scored rollouts (samples × epochs) whose every call was executable."""

    def compute(scores: list[SampleScore]) -> float:
        return _mean([bool(_value(s)["executable"]) for s in scores])

    return compute


@metric(scores="unreduced")
def auc_pec() -> Metric:
    """AUC-PEC: the mean over scored rollouts of (FED - 1) / T (1 for a rollout with no call)."""

    def compute(scores: list[SampleScore]) -> float:
        return _mean([float(_value(s)["auc_term"]) for s in scores])

    return compute


@scorer(metrics=[ter(), auc_pec()])
def executability(
    env: str = "observed", spec: str | None = None, policy: str = "code", checks: tuple[str, ...] = CHECKS
) -> Scorer:
    """Replay the sample's tool calls against environment `env` (`observed`, a built-in simulator, or a spec
    name) with `spec` giving `observed` its schemas and rules, as `pexec score --env ENV --spec SPEC --policy
    POLICY --checks CHECKS` does."""
    if policy not in ("code", "strict"):
        raise ValueError(f"policy is code or strict, got {policy!r}")
    environment = get_environment(env, EnvOptions(spec=spec, policy=policy))

    async def score(state: TaskState, target: Target) -> Score:
        sample = {
            "id": state.sample_id,
            "epoch": state.epoch,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in state.messages],
        }
        record = sample_record(sample, {"model": str(state.model)}, f"sample {state.sample_id}")
        result = replay(environment, parse_rollout({**record, "benchmark": env}), checks)
        return Score(value=_value_of(result), explanation=_explanation(result), metadata={"steps": _steps(result)})

    return score


def _value_of(result: RolloutResult) -> dict[str, int | float | bool]:
    """The score's value: the rollout's fed, T, executable and auc_term (Inspect takes a plain mapping)."""
    return {"fed": result.fed, "T": result.T, "executable": result.executable, "auc_term": result.auc_term}


class StepJSON(TypedDict):
    """A call's verdict in the score's metadata (`steps`)."""

    step: int
    tool: str
    valid: bool
    failed_check: str | None
    cause: str | None
    detail: str | None


def _steps(result: RolloutResult) -> list[StepJSON]:
    return [_step(s) for s in result.steps]


def _step(s: StepResult) -> StepJSON:
    return {
        "step": s.step,
        "tool": s.tool,
        "valid": s.valid,
        "failed_check": s.failed_check,
        "cause": s.cause,
        "detail": s.detail,
    }


def _explanation(result: RolloutResult) -> str:
    first = result.first_invalid
    if first is None:
        return f"all {result.T} calls executable"
    return f"first invalid call at depth {first.step} of {result.T}: {first.tool} ({first.failed_check}, {first.cause})"


def _value(s: SampleScore) -> dict[str, Any]:  # a score's value as Inspect hands it back (maybe from a log)
    value = s.score.value
    if not isinstance(value, dict):
        raise ValueError(f"sample {s.sample_id}: not a score of pexec's executability scorer: {value!r}")
    return value


def _mean(values: list[float] | list[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")
