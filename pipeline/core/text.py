"""Text from data shown to a person (a terminal, a figure): every control character as its Python escape.

Labels, values, paths and messages come from untrusted logs. Escape sequences, carriage returns, bells, newlines
and bidi overrides would otherwise move a terminal's cursor, restyle it or reorder what it shows, and a figure
would draw them as empty boxes. A URL shown anywhere (a repr, a page header) drops the credentials a URL can carry.

Imports: nothing of pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # C0, C1, bidi overrides


def literal(value: Any) -> str:
    """`value` as text with each control character written as its Python escape (`\\x1b`, `\\n`, `\\u202e`)."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode(), str(value))


def label_text(value: Any) -> str:
    """A label's value as a table shows it: `literal`, and a dash for a missing one (null), never the text "None",
    which a label can hold."""
    return "–" if value is None else literal(value)


def clipped(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more were cut (`… (1,234 more characters)`)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def public_url(url: str) -> str:
    """`url` as it may be shown: user and password (`s3://KEY:SECRET@bucket`, `https://user:token@host`) and a
    query string (a presigned URL's signature) are replaced by `***`; everything else is kept as given."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL (an unbalanced `[`): a plain path, shown as it is
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def some(items: Sequence[str], shown: int) -> str:
    """The first `shown` of `items` joined by commas, the rest counted (`a, b, c and 7 more`): a message that
    lists what exists stays one bounded line however many there are."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 0 else "")
