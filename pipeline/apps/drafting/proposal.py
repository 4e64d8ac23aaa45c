"""From evidence to a draft spec folder a person reviews: `tools.json` (the definitions seen, the most used one per
tool, with how many versions and where they differ), `spec.toml` (grounded parameters proposed from evidence, each
with its share and count beside it; candidate `observed` rules commented out with their support and precision),
`initial_state.json` (empty: `observed` has no state). Pure: evidence and settings in, file texts out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.apps.drafting.evidence import SKETCH, Condition, Evidence, ToolEvidence, estimate

NO_DEFINITION: dict[str, Any] = {"type": "object"}  # a tool the log recorded no definition of: any object


@dataclass(frozen=True)
class DraftSettings:
    """The thresholds a proposal needs (all printed in the draft's header)."""

    min_share: float = 0.9  # a parameter is grounded when its value occurred earlier in at least this share...
    min_calls: int = 20  # ...of at least this many calls
    free_text: bool = False  # also propose parameters whose values are mostly not identifiers
    rule_support: int = 3  # a rule candidate needs this many failing calls...
    rule_precision: float = 0.8  # ...and this share of the calls it holds for failing with its template
    # A parameter whose values occurred earlier only in messages (the user's own words, not a tool's output) is
    # proposed only when each of its values is used by at least this many tasks on average: a value the system
    # holds and users quote (an account, a coupon code), not what each user says about themselves (an e-mail,
    # a new address, a date).
    min_reuse: float = 3.0


@dataclass(frozen=True)
class Grounded:
    path: str
    values: int
    share: float  # of values that occurred earlier
    identifiers: float  # share of values that look like identifiers
    from_messages: float  # of the values that occurred earlier, the share that occurred only in a message
    distinct: float  # distinct values (exact up to evidence.SKETCH, else estimated)
    top: float  # share of the values that are the most common one (exact up to SKETCH distinct values)
    reuse: float  # tasks per distinct value (estimated past SKETCH)
    proposed: bool
    why: str


@dataclass(frozen=True)
class RuleCandidate:
    template: str
    example: str
    condition: Condition
    support: int  # failing calls with the template where the condition held
    precision: float  # of the calls the condition held for, the share that failed with the template
    failing: int  # all failing calls with the template


def grounded(tool: ToolEvidence, s: DraftSettings) -> list[Grounded]:
    """Each argument path with its evidence and whether it is proposed. A value that occurred earlier is evidence
    the agent copied it only when the values vary (one value in nearly every call would match whatever the agent
    did: a constant, not a copy) and, for values only the messages carried, when they name something the system
    holds, used across tasks, rather than what one user says about themselves."""
    out = []
    for path, c in sorted(tool.paths.items()):
        share = c.known / c.values if c.values else 0.0
        ident = c.identifiers / c.values if c.values else 0.0
        stated = c.from_messages / c.known if c.known else 0.0
        distinct = min(estimate(c.distinct), c.values)  # an estimate past SKETCH distinct values
        top = max(c.distinct.values(), default=0) / c.values if c.values else 0.0
        reuse = max(1.0, min(estimate(c.pairs), c.values) / distinct) if distinct else 0.0  # each value: >= 1 task
        if c.values < s.min_calls:
            proposed, why = False, f"fewer than {s.min_calls} values"
        elif share < s.min_share:
            proposed, why = False, f"below {s.min_share:.0%}"
        elif ident < 0.5 and not s.free_text:
            proposed, why = False, "free text, not an identifier (--free-text to propose)"
        elif top >= s.min_share:
            proposed, why = False, f"one value in {top:.0%} of calls: a constant, not shown copied"
        elif stated >= 0.5 and reuse < s.min_reuse:
            proposed, why = (
                False,
                (
                    f"occurred only in messages, each value in {reuse:.1f} tasks: what users say about themselves "
                    "(--min-reuse 0 proposes it)"
                ),
            )
        elif stated >= 0.5:
            proposed, why = True, f"proposed: occurred only in messages, each value in {reuse:.1f} tasks"
        else:
            proposed, why = True, "proposed"
        out.append(Grounded(path, c.values, share, ident, stated, distinct, top, reuse, proposed, why))
    return out


def rules(tool: ToolEvidence, s: DraftSettings) -> list[RuleCandidate]:
    """Per error template, the conditions that separate its failing calls from the others, best first."""
    out = []
    for (cond, template), support in tool.failed_with.items():
        held = tool.held[cond]
        precision = support / held if held else 0.0
        if support >= s.rule_support and precision >= s.rule_precision:
            failing = tool.templates[template]
            out.append(RuleCandidate(template, tool.examples.get(template, ""), cond, support, precision, failing))
    return sorted(out, key=lambda r: (r.template, -r.precision, -r.support, r.condition))


def tools_json(evidence: Evidence) -> list[dict[str, Any]]:
    """The draft's tools.json: per tool, the definition under which it was called most (ties: the latest seen),
    and under `seen` how often, in how many versions, and what differs between them."""
    out = []
    for name, tool in sorted(drafted(evidence).items()):
        ranked = sorted(tool.variants.items(), key=lambda kv: (kv[1].calls, kv[1].last), reverse=True)
        parameters = orjson.loads(ranked[0][0]) if ranked else NO_DEFINITION
        seen: dict[str, Any] = {"calls": tool.calls, "versions": len(ranked)}
        if not ranked:
            seen["note"] = "no definition in the log: any object passes S; write the schema"
        if len(ranked) > 1:
            seen["variants"] = [
                {"calls": v.calls, "conversations": v.conversations, "first": v.first, "last": v.last,
                 "differs": differences(parameters, orjson.loads(key))}
                for key, v in ranked
            ]  # fmt: skip
        out.append({"type": "function", "function": {"name": name, "parameters": parameters}, "seen": seen})
    return out


def drafted(evidence: Evidence) -> dict[str, ToolEvidence]:
    """The tools the draft declares: every tool called when the logs recorded no definitions at all; else the tools
    the logs defined (a tool called but never given to the model stays unknown, an S failure, as it was)."""
    if not any(t.variants for t in evidence.tools.values()):
        return evidence.tools
    return {n: t for n, t in evidence.tools.items() if t.variants}


def undefined(evidence: Evidence) -> dict[str, int]:
    """Tools called that the draft leaves out (never defined while others were), with their calls."""
    kept = drafted(evidence)
    return {n: t.calls for n, t in sorted(evidence.tools.items()) if n not in kept}


def differences(a: Any, b: Any) -> list[str]:
    """What schema `b` changes against `a`: properties added or removed, requirements and types changed."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [] if a == b else ["the whole schema"]
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    out = [f"+{k}" for k in sorted(set(pb) - set(pa))] + [f"-{k}" for k in sorted(set(pa) - set(pb))]
    ra, rb = set(a.get("required") or ()), set(b.get("required") or ())
    out += [f"{k} required" for k in sorted(rb - ra)] + [f"{k} optional" for k in sorted(ra - rb)]
    out += [f"{k}: {pa[k]} -> {pb[k]}" for k in sorted(set(pa) & set(pb)) if pa[k] != pb[k]]
    if a.get("additionalProperties") != b.get("additionalProperties"):
        out.append(f"additionalProperties: {a.get('additionalProperties')} -> {b.get('additionalProperties')}")
    return out


def spec_toml(evidence: Evidence, s: DraftSettings, name: str, header: list[str]) -> str:
    lines = [f"# {h}" if h else "#" for h in header]
    lines += [
        f"name = {_q(name)}",
        'version = "0.0.0-draft"',
        f"description = {_q('Drafted from logs by pexec spec draft: review before use')}",
        "",
    ]
    left_out = undefined(evidence)
    if left_out:
        lines.append("# Called but never defined in the logs (left out: still an unknown tool, an S failure):")
        lines += [f"#   {name}: {calls} calls" for name, calls in left_out.items()]
        lines.append("")
    for tool_name, tool in sorted(drafted(evidence).items()):
        lines.append(f"[tool.{_key(tool_name)}]")
        lines.append(f"# {tool.calls} calls, {tool.captured} with arguments, {tool.failed} failed in the log")
        found = grounded(tool, s)
        for g in found:
            lines.append(
                f"#   {g.path}: occurred earlier in {g.share:.1%} of {g.values} values (calls not failing), "
                f"{g.from_messages:.0%} of those only in messages; identifiers {g.identifiers:.0%}; "
                f"{'about ' if g.distinct >= SKETCH else ''}{g.distinct:,.0f} distinct: {g.why}"
            )
        chosen = [g.path for g in found if g.proposed]
        if chosen:
            lines.append("grounded = [" + ", ".join(_q(p) for p in chosen) + "]")
        candidates = rules(tool, s)
        if candidates:
            lines.append("# Candidate `observed` rules mined from logged errors: none is enabled; uncomment to use.")
            for template in sorted({c.template for c in candidates}):
                ofs = [c for c in candidates if c.template == template]
                lines.append(f"#   error {_q(template)}: {ofs[0].failing} failing calls, e.g. {_q(ofs[0].example)}")
            lines.append("# observed = [")
            for c in candidates:
                lines.append(f"#   {_rule(c)},  # support {c.support}, precision {c.precision:.2f}")
            lines.append("# ]")
        lines.append("")
    return "\n".join(lines)


def _rule(c: RuleCandidate) -> str:
    tool, link, arg, fld, value = c.condition
    shown = json.loads(value)
    literal = repr(shown) if isinstance(shown, str) else ("True" if shown else "False")
    require = f"seen.{tool}.{link} != args.{arg} or seen.{tool}.{fld} != {literal}"
    said = c.template.replace("{", "(").replace("}", ")")  # braces would be read as placeholders
    error = f"{said} (seen.{tool}.{fld} is {{seen.{tool}.{fld}}})"
    return f"{{ require = {_q(require)}, error = {_q(error)} }}"


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a TOML basic string is a JSON string


def _key(name: str) -> str:
    bare = name.replace("_", "").replace("-", "").isalnum() and name.isascii()
    return name if bare else _q(name)
