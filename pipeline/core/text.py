"""Text from data shown to a person (a terminal, a figure): every control character as its Python escape.

Labels, values, paths and messages come from untrusted logs. Escape sequences, carriage returns, bells, newlines
and bidi overrides would otherwise move a terminal's cursor, restyle it or reorder what it shows, and a figure
would draw them as empty boxes.

Imports: nothing of pipeline.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # C0, C1, bidi overrides


def literal(value: Any) -> str:
    """`value` as text with each control character written as its Python escape (`\\x1b`, `\\n`, `\\u202e`)."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode(), str(value))
