"""`pexec guard replay LOGS --spec NEW [--against OLD]`: what a guard under a new spec would have done on recorded
traffic, before it is deployed.

Each recorded rollout is replayed through guard sessions (pipeline.apps.guard.session, the batch checker's own
`Session`) in the `observed` environment with NEW's schemas, grounded parameters and `observed` rules (and, with
`--against`, OLD's beside it). Every call is checked as the live guard checks it, before it runs (its logged
outcome withheld), then recorded with what production logged, so the sessions see what the agent saw. A call the
guard that wrote the log had refused (its logged output begins with `REFUSAL_PREFIX`) never reached production: it
is counted apart, never as a production error.

Counted, per call: refused under NEW, by tool and rule (the failed check and its cause: P precondition for an
`observed` rule, D information (grounded amount) for a grounded parameter's value found nowhere, …); among them,
those in rollouts that succeeded anyway (probable false refusals) and those production logged as errors (errors the
guard would have caught); with OLD, the calls NEW refuses that OLD accepted, and those OLD refused that NEW lets
through. A refused call is still replayed as logged: what the agent would have done after a refusal is not known, so
a later call's verdict is the one it gets on the recorded path.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TypedDict

from pipeline.apps.guard.session import GuardSession, GuardVerdict, open_session
from pipeline.core.model import NOT_LOGGED, Call, Message, Rollout
from pipeline.envs import EnvOptions

REFUSAL_PREFIX = "pexec guard refused"  # pipeline.apps.guard.mcp.refusal: the MCP guard's own refusals
EXAMPLES = 5  # refused calls kept per (tool, rule) as examples
# Distinct tool names counted apart (logs are untrusted: any number of names may appear); the calls of the tools
# seen after that many are counted under OTHER_TOOLS, and `other_tools` says how many names were folded there.
MAX_TOOLS = 1000
OTHER_TOOLS = "(other tools)"
ENVIRONMENT = "observed"
GROUNDING_DETAIL = " occurs in no earlier output or message"  # pipeline.replay.checker's grounding detail


class RefusalExample(TypedDict):
    """A call the guard would refuse under NEW, kept as an example (EXAMPLES per tool and rule)."""

    tool: str
    rule: str
    rollout_id: str
    step: int
    detail: str | None
    success: bool | None  # the rollout's own verdict
    logged_error: bool  # production logged the call as an error


class RuleCount(TypedDict):
    tool: str
    rule: str
    calls: int


class RulesJSON(TypedDict):
    refused: list[RuleCount]
    false_refusals: list[RuleCount]
    caught: list[RuleCount]
    newly_refused: list[RuleCount]
    released: list[RuleCount]


class ReplayJSON(TypedDict):
    """`pexec guard replay --json` (and replay.json): the population, the totals, the counts per tool and rule,
    the examples."""

    spec: str
    against: str | None
    environment: str
    rollouts: int
    calls: int
    logged_errors: int
    guard_refused: int
    other_tools: int  # tool names folded into OTHER_TOOLS
    refused: int
    false_refusals: int
    caught: int
    newly_refused: int
    released: int
    by_rule: RulesJSON
    examples: list[RefusalExample]


@dataclass
class ReplayReport:
    spec: str
    against: str | None
    rollouts: int = 0
    calls: int = 0
    logged_errors: int = 0  # calls production logged as errors (not counting the recording guard's refusals)
    guard_refused: int = 0  # calls the guard that wrote the log refused (they never ran)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tool, rule) under NEW
    false_refusals: Counter[tuple[str, str]] = field(default_factory=Counter)  # refused, in a successful rollout
    caught: Counter[tuple[str, str]] = field(default_factory=Counter)  # refused, and an error in production
    newly_refused: Counter[tuple[str, str]] = field(default_factory=Counter)  # NEW refuses, OLD accepted
    released: Counter[tuple[str, str]] = field(default_factory=Counter)  # OLD refused (its rule), NEW accepts
    examples: dict[tuple[str, str], list[RefusalExample]] = field(default_factory=dict)
    tools: set[str] = field(default_factory=set)  # the names counted apart (at most MAX_TOOLS)
    other_tools: set[str] = field(default_factory=set)  # names folded into OTHER_TOOLS (kept up to MAX_TOOLS)
    more_other_tools: int = 0  # calls of folded names beyond those kept

    def tool_key(self, tool: str) -> str:
        """`tool`, or OTHER_TOOLS once MAX_TOOLS names are counted apart."""
        if tool in self.tools or len(self.tools) < MAX_TOOLS:
            self.tools.add(tool)
            return tool
        if len(self.other_tools) < MAX_TOOLS:
            self.other_tools.add(tool)
        else:
            self.more_other_tools += 1
        return OTHER_TOOLS

    def totals(self) -> dict[str, int]:
        """The counts a --fail-on can name."""
        return {
            "refused": sum(self.refused.values()),
            "false_refusals": sum(self.false_refusals.values()),
            "caught": sum(self.caught.values()),
            "newly_refused": sum(self.newly_refused.values()),
            "released": sum(self.released.values()),
        }

    def to_json(self) -> ReplayJSON:
        def rows(counter: Counter[tuple[str, str]]) -> list[RuleCount]:
            return [{"tool": t, "rule": r, "calls": n} for (t, r), n in sorted(counter.items())]

        totals = self.totals()
        return {
            "spec": self.spec,
            "against": self.against,
            "environment": ENVIRONMENT,
            "rollouts": self.rollouts,
            "calls": self.calls,
            "logged_errors": self.logged_errors,
            "guard_refused": self.guard_refused,
            "other_tools": len(self.other_tools),
            "refused": totals["refused"],
            "false_refusals": totals["false_refusals"],
            "caught": totals["caught"],
            "newly_refused": totals["newly_refused"],
            "released": totals["released"],
            "by_rule": {
                "refused": rows(self.refused),
                "false_refusals": rows(self.false_refusals),
                "caught": rows(self.caught),
                "newly_refused": rows(self.newly_refused),
                "released": rows(self.released),
            },
            "examples": [e for key in sorted(self.examples) for e in self.examples[key]],
        }


def rule_of(verdict: GuardVerdict) -> str:
    """The rule a refusal names: its failed check and cause (`P precondition`, `S schema`, …), and for a grounded
    value found nowhere the parameter (`D information (grounded amount)`, from the checker's detail
    `<parameter>=<value> occurs in no earlier output or message`)."""
    rule = f"{verdict.failed_check} {verdict.cause}"
    detail = verdict.detail or ""
    if verdict.cause == "information" and GROUNDING_DETAIL in detail and "=" in detail:
        return f"{rule} (grounded {detail.split('=', 1)[0]})"
    return rule


def replay_traffic(
    rollouts: Iterable[Rollout], spec: str, against: str | None = None, spec_dirs: tuple[str, ...] = ()
) -> ReplayReport:
    """Replay every rollout under NEW (and OLD) and count what the guard would have refused."""
    report = ReplayReport(spec, against)
    new_options = EnvOptions(spec_dirs, spec)
    old_options = EnvOptions(spec_dirs, against) if against is not None else None
    for rollout in rollouts:
        report.rollouts += 1
        _replay_one(rollout, new_options, old_options, report)
    return report


def _replay_one(rollout: Rollout, new: EnvOptions, old: EnvOptions | None, report: ReplayReport) -> None:
    def session(options: EnvOptions) -> GuardSession:
        return open_session(
            ENVIRONMENT,
            rollout.env,
            options=options,
            rollout_id=rollout.rollout_id,
            task_id=rollout.task_id,
            labels=rollout.labels,
        )

    sessions = [session(new)]
    if old is not None:
        sessions.append(session(old))
    try:
        for event in rollout.events:
            if isinstance(event, Message):
                for s in sessions:
                    s.message(event.role, event.content, event.turn)
                continue
            if isinstance(event, Call):
                verdicts = [s.check(replace(event, output=NOT_LOGGED, error=None)) for s in sessions]
                _count(rollout, event, verdicts, report)
                for s in sessions:
                    s.record(event)
    finally:
        for s in sessions:
            s.close()


def _count(rollout: Rollout, call: Call, verdicts: list[GuardVerdict], report: ReplayReport) -> None:
    report.calls += 1
    refused_before = call.error is True and str(call.output).startswith(REFUSAL_PREFIX)
    failed = call.error is True and not refused_before
    report.guard_refused += refused_before
    report.logged_errors += failed
    new = verdicts[0]
    old = verdicts[1] if len(verdicts) > 1 else None
    tool = report.tool_key(call.tool)
    if not new.valid:
        key = (tool, rule_of(new))
        report.refused[key] += 1
        report.false_refusals[key] += rollout.success is True
        report.caught[key] += failed
        if old is not None and old.valid:
            report.newly_refused[key] += 1
        kept = report.examples.setdefault(key, [])
        if len(kept) < EXAMPLES:
            kept.append(
                {
                    "tool": tool,
                    "rule": key[1],
                    "rollout_id": rollout.rollout_id,
                    "step": new.step,
                    "detail": new.detail,
                    "success": rollout.success,
                    "logged_error": failed,
                }
            )
    elif old is not None and not old.valid:
        report.released[(tool, rule_of(old))] += 1
    for counter in (report.false_refusals, report.caught):  # no zero entries in the tables
        for k in [k for k, n in counter.items() if not n]:
            del counter[k]


_SECTIONS = (
    ("refused", "Calls NEW would refuse"),
    ("false_refusals", "… in rollouts that succeeded anyway (probable false refusals)"),
    ("caught", "… that failed in production (errors the guard would have caught)"),
    ("newly_refused", "Calls NEW refuses that OLD accepted"),
    ("released", "Calls OLD refused that NEW lets through (by OLD's rule)"),
)


def summary_lines(report: ReplayReport) -> list[str]:
    """The population and the headline counts, one line each."""
    t = report.totals()
    lines = [
        f"{report.calls} call(s) in {report.rollouts} rollout(s) replayed under {report.spec}"
        + (f" against {report.against}" if report.against else "")
        + f" ({ENVIRONMENT}; {report.logged_errors} logged as errors in production"
        + (f", {report.guard_refused} refused by the guard that logged them" if report.guard_refused else "")
        + ")",
        f"would refuse {t['refused']} call(s): {t['false_refusals']} in rollouts that succeeded anyway (probable "
        f"false refusals), {t['caught']} that failed in production (errors it would have caught)",
    ]
    if report.other_tools:
        lines.append(
            f"more than {MAX_TOOLS} tool names: the calls of {len(report.other_tools)} are counted as {OTHER_TOOLS}"
        )
    if report.against:
        lines.append(
            f"against {report.against}: {t['newly_refused']} newly refused, {t['released']} refused before and "
            "let through now"
        )
    return lines


def markdown(report: ReplayReport) -> str:
    parts = [f"# Guard replay: {report.spec}", "", *(f"- {line}" for line in summary_lines(report)), ""]
    parts.append(
        "Each call is checked as the live guard checks it, before it runs; a refused call is still replayed as "
        "logged (what the agent would have done after a refusal is not known). Rule = the failed check and its cause "
        "(and the parameter of a grounded value found nowhere)."
    )
    for name, title in _SECTIONS:
        counter: Counter[tuple[str, str]] = getattr(report, name)
        if name in ("newly_refused", "released") and not report.against:
            continue
        parts += ["", f"## {title}", ""]
        if not counter:
            parts.append("None.")
            continue
        parts += ["| tool | rule | calls |", "|---|---|---:|"]
        parts += [f"| {_md(t)} | {_md(r)} | {n} |" for (t, r), n in sorted(counter.items())]
    examples = [e for key in sorted(report.examples) for e in report.examples[key]]
    if examples:
        parts += ["", "## Examples of refused calls", "", "| tool | rule | rollout | step | success | detail |"]
        parts.append("|---|---|---|---:|---|---|")
        parts += [
            f"| {_md(e['tool'])} | {_md(e['rule'])} | {_md(e['rollout_id'])} | {e['step']} | {e['success']} | "
            f"{_md(str(e['detail']))} |"
            for e in examples
        ]
    return "\n".join(parts) + "\n"


def html_page(report: ReplayReport) -> str:
    body = [f"<h1>Guard replay: {html.escape(report.spec)}</h1>", "<ul>"]
    body += [f"<li>{html.escape(line)}</li>" for line in summary_lines(report)]
    body.append("</ul>")
    for name, title in _SECTIONS:
        counter: Counter[tuple[str, str]] = getattr(report, name)
        if name in ("newly_refused", "released") and not report.against:
            continue
        body.append(f"<h2>{html.escape(title)}</h2>")
        if not counter:
            body.append("<p>None.</p>")
            continue
        body.append("<table><tr><th>tool</th><th>rule</th><th>calls</th></tr>")
        body += [
            f"<tr><td>{html.escape(t)}</td><td>{html.escape(r)}</td><td>{n}</td></tr>"
            for (t, r), n in sorted(counter.items())
        ]
        body.append("</table>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Guard replay</title></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
