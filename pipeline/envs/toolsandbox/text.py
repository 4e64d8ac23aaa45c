"""Fuzzy string scores in the spirit of rapidfuzz's WRatio / partial_ratio (0–100), built on difflib.

Upstream filters names, relationships and contents with rapidfuzz; this is a close, dependency-free
approximation (it can differ from rapidfuzz by a few points near a threshold).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def normalize(text: str) -> str:
    """Lower-case, non-alphanumerics as single spaces (rapidfuzz's default_process)."""
    return _NON_ALNUM.sub(" ", text.lower()).strip()


def ratio(a: str, b: str) -> float:
    if not a and not b:
        return 100.0
    return 100.0 * SequenceMatcher(None, a, b, autojunk=False).ratio()


def partial_ratio(a: str, b: str) -> float:
    """Best ratio of the shorter string against any same-length window of the longer one."""
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    if not short:
        return 0.0
    width = len(short)
    return max(ratio(short, long[i : i + width]) for i in range(len(long) - width + 1))


def _token_scores(a: str, b: str) -> float:
    ta, tb = set(a.split()), set(b.split())
    common = " ".join(sorted(ta & tb))
    rest_a, rest_b = " ".join(sorted(ta - tb)), " ".join(sorted(tb - ta))
    sort_score = ratio(" ".join(sorted(a.split())), " ".join(sorted(b.split())))
    left, right = f"{common} {rest_a}".strip(), f"{common} {rest_b}".strip()
    set_score = max(ratio(common, left), ratio(common, right), ratio(left, right)) if common else 0.0
    return max(sort_score, set_score)


def wratio(query: str, choice: str) -> float:
    a, b = normalize(query), normalize(choice)
    if not a or not b:
        return 0.0
    scale = max(len(a), len(b)) / min(len(a), len(b))
    best = ratio(a, b)
    if scale < 1.5:
        return max(best, 0.95 * _token_scores(a, b))
    partial = 0.9 if scale < 8 else 0.6
    return max(best, partial * partial_ratio(a, b), 0.95 * partial * _token_scores(a, b))
