"""BFCL function docs -> JSON Schema.

BFCL writes its own type names ("dict", "float", "tuple", "any"); they are mapped to JSON Schema types.
A parameter whose Python default is None also accepts null (the method treats it as "not given").
Unknown keys are forbidden when the method takes no **kwargs: Python would refuse them.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "integer": "integer",
    "int": "integer",
    "string": "string",
    "str": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
}
_KEEP = ("description", "enum", "default", "minimum", "maximum")


def parameters_schema(
    parameters: dict[str, Any], open_keys: bool = False, nullable: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The JSON Schema of a function's `parameters` (a BFCL "dict"); `nullable`: parameters whose Python
    default is None."""
    schema = convert(parameters)
    for name in nullable & set(schema.get("properties", {})):
        kind = schema["properties"][name].get("type")
        if isinstance(kind, str):
            schema["properties"][name]["type"] = [kind, "null"]
    schema["type"] = "object"
    schema.setdefault("properties", {})
    schema["required"] = list(parameters.get("required", []))
    if not open_keys:
        schema["additionalProperties"] = False
    return schema


def convert(node: dict[str, Any]) -> dict[str, Any]:
    """One BFCL type node -> JSON Schema (recursively through properties and items)."""
    out: dict[str, Any] = {k: node[k] for k in _KEEP if k in node}
    kind = node.get("type")
    if kind not in (None, "any"):
        if kind not in _TYPES:
            raise ValueError(f"unknown BFCL type {kind!r}")
        json_type = _TYPES[kind]
        out["type"] = [json_type, "null"] if "default" in node and node["default"] is None else json_type
    if "properties" in node:
        out["properties"] = {name: convert(sub) for name, sub in node["properties"].items()}
        if node.get("required"):
            out["required"] = list(node["required"])
    if "items" in node:
        out["items"] = convert(node["items"])
    return out
