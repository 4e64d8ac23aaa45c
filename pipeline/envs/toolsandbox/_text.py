"""Fuzzy text matching as upstream's tools do it, with the library upstream uses (rapidfuzz, pinned as upstream
pins it): searches keep the rows whose column scores at least a threshold under WRatio, best first, at most
five (rapidfuzz's `process.extract` default); holiday names are ranked by partial_ratio. Both lower-case and
strip punctuation first (rapidfuzz's default_process)."""

from __future__ import annotations

from typing import Any

from rapidfuzz import fuzz, process, utils

SEARCH_LIMIT = 5  # process.extract's default `limit`, which upstream's fuzzy filter leaves as is


def fuzzy_filter(rows: list[dict[str, Any]], column: str, query: str | None, threshold: float) -> list[dict[str, Any]]:
    """The rows whose `column` matches `query`, best first (ties in row order); a null cell never matches."""
    hits = process.extract(query, [r[column] for r in rows], processor=utils.default_process, scorer=fuzz.WRatio,
                           score_cutoff=threshold, limit=SEARCH_LIMIT)  # fmt: skip
    return [rows[index] for _, _, index in hits]


def partial_score(query: str, choice: str) -> float:
    return fuzz.partial_ratio(query, choice, processor=utils.default_process)
