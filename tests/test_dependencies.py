"""The grounding history answers the same whatever was asked before: its postings are built as words are
asked about and brought up to date as texts arrive, and values once found are remembered."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.replay import dependencies
from pipeline.replay.dependencies import History

WORDY = st.text(alphabet='ab1-. "\\\n', max_size=5)  # few words: later texts often hold earlier ones
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("say"), WORDY),
        st.tuples(st.just("output"), st.dictionaries(WORDY, WORDY, max_size=2)),
        st.tuples(st.just("ask"), st.one_of(WORDY, st.integers(-20, 20))),
    ),
    max_size=14,
)


def _add(history: History, step: int, kind: str, item: object) -> None:
    if kind == "say":
        history.add_message(item)  # type: ignore[arg-type]
    elif kind == "output":
        history.add_result(step, None, True, item)


def _replayed(events: list[tuple[str, object]]) -> History:
    """A history of the texts only, asked nothing before."""
    history = History()
    for step, (kind, item) in enumerate(events, 1):
        _add(history, step, kind, item)
    return history


@pytest.mark.parametrize("scanned", [dependencies._SCANNED_CHARS, 0])  # 0: always through the word index
@pytest.mark.parametrize(("budget", "split"), [(dependencies.INDEX_ENTRIES, 65_536), (0, 65_536), (4, 65_536), (50, 3)])
@given(EVENTS)
def test_asking_as_the_history_grows_answers_as_a_fresh_history(
    scanned: int, budget: int, split: int, events: list[tuple[str, object]]
) -> None:
    # A full index (budget 0 or 4 entries) or texts too long to split (over 3 characters) answer the same.
    history = History(index_budget=budget)
    with patch.object(dependencies, "_SCANNED_CHARS", scanned), patch.object(dependencies, "_SPLIT_CHARS", split):
        for step, (kind, item) in enumerate(events, 1):
            if kind == "ask":
                assert history.knows(item) == _replayed(events[:step]).knows(item), (events[:step], item)
                assert history.indexed <= budget
            else:
                _add(history, step, kind, item)
    held = len(history.known) + sum(len(p) + 1 for p, _ in history.postings.values())
    assert history.indexed == held + sum(len(w) for w in history.vocabulary if w is not None)


def test_the_word_index_stays_within_its_budget_on_a_large_history() -> None:
    # Measured before: one check on a guard session at its 16 MiB budget grew it to 154 MiB (the word index).
    history = History(index_budget=10_000)
    for step in range(200):
        history.add_result(step + 1, None, True, " ".join(f"w{step}x{i}" for i in range(2_000)))
    for asked in ("w3x7", "w150x1999", "nowhere", "w199x0"):
        assert history.knows(asked) == (asked != "nowhere")
    assert history.indexed <= 10_000
    assert sum(len(w) for w in history.vocabulary if w is not None) <= 10_000


def test_a_word_asked_about_early_is_found_in_texts_added_later() -> None:
    history = History()
    history.add_message("order O12 is late")
    assert not history.knows("U7")
    history.add_result(1, None, True, {"user_id": "U7"})
    assert history.knows("U7") and history.knows("O12")
    assert not history.knows("U")  # part of a word is not the word
