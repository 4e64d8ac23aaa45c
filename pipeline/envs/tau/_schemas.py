"""Generate `specs/tau_<domain>/tools.json` from the pinned official tool code (run when re-pinning):

    python -m pipeline.envs.tau._schemas

The official code builds OpenAI schemas from the tool signatures but never validates arguments against
them. We tighten them into the schemas S is checked against: unknown top-level keys are refused (the
official call would raise TypeError), and list items must match their pydantic model (the official code
builds the model from each dict and fails on a missing field) instead of "any object".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pipeline.envs.data import BUILTIN_SPECS

DOMAINS = ("airline", "retail", "telecom")

# τ³ (2026) added this retail tool; the pinned wheel predates it, so its schema is written here.
EXTRA_TOOLS: dict[str, dict[str, dict[str, Any]]] = {
    "retail": {
        "get_item_details": {
            "description": "Get the inventory details of an item.",
            "parameters": {
                "type": "object",
                "properties": {
                    "item_id": {
                        "type": "string",
                        "description": "The item id, such as '6086499569'. Be careful the item id is different "
                        "from the product id.",
                    }
                },
                "required": ["item_id"],
            },
        }
    }
}


def tighten(schema: Any) -> Any:
    """Drop titles, replace `anyOf: [model, any object]` by the model (a `[model, string]` stays: the official code
    takes any string and answers an unknown one itself), refuse unknown top-level keys."""
    if isinstance(schema, list):
        return [tighten(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: tighten(v) for k, v in schema.items() if k != "title"}
    options = out.get("anyOf")
    if isinstance(options, list):
        models = [o for o in options if "$ref" in o]
        others = [o for o in options if "$ref" not in o]
        if len(models) == 1 and len(options) == 2 and others[0].get("type") == "object":
            del out["anyOf"]
            out.update(models[0])
    return out


def official_tools(domain: str) -> list[dict[str, Any]]:
    """The domain's tools (telecom: the operator's and the phone's, whose names upstream keeps apart)."""
    if domain == "telecom":
        from pipeline.envs.tau.telecom import load_environment

        env = load_environment()
        found = env.tools.get_tools() | env.user_tools.get_tools()
    else:
        from pipeline.envs.tau.env import load_toolkit

        found = load_toolkit(domain).get_tools()
    tools = []
    for name, tool in sorted(found.items()):
        fn = tool.openai_schema["function"]
        params = tighten(fn["parameters"])
        params["additionalProperties"] = False
        tools.append(
            {"type": "function", "function": {"name": name, "description": fn["description"], "parameters": params}}
        )
    for name, fn in sorted(EXTRA_TOOLS.get(domain, {}).items()):
        params = {**fn["parameters"], "additionalProperties": False}
        tools.append(
            {"type": "function", "function": {"name": name, "description": fn["description"], "parameters": params}}
        )
    return sorted(tools, key=lambda t: t["function"]["name"])


def tools_path(domain: str) -> Path:
    return BUILTIN_SPECS / f"tau_{domain}" / "tools.json"


def main() -> None:
    for domain in DOMAINS:
        path = tools_path(domain)
        path.write_bytes(orjson.dumps(official_tools(domain), option=orjson.OPT_INDENT_2) + b"\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
