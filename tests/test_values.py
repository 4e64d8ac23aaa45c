"""Outputs compare as values: numbers within 1e-9, Python-repr text (ToolSandbox) read as literals, never run."""

from __future__ import annotations

import enum

import orjson
import pytest

from pipeline.core.model import Call, Message, Rollout
from pipeline.core.values import NotExact, decoded, json_copy, same
from pipeline.envs import get_environment
from pipeline.replay.checker import replay


@pytest.mark.parametrize(
    ("replayed", "logged", "equal"),
    [
        (1234.567890123, 1234.5678901234, True),  # relative difference ~1e-13
        (1234.5678, 1234.5679, False),
        (1e-12, 0.0, True),  # absolute tolerance
        (1e-6, 0.0, False),
        ({"distance": 3.2000000000001, "unit": "km"}, "{'distance': 3.2, 'unit': 'km'}", True),
        ([{"name": "Fredrik", "ok": True}], "[{'name': 'Fredrik', 'ok': True}]", True),
        ([1, 2], "(1, 2)", True),  # a tuple's repr
        ({"phone": "+1"}, "{'phone': None}", False),
        (True, 1, False),  # a boolean is not a number
        (1, "1.0000000000001", True),
        ("abc", "'abc'", True),
        ("abc", "  abc ", True),
        (None, "None", True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ([1, 2], [1, 2, 3], False),
        # Equal in Python but not here, or the same JSON text for different values:
        ([True, 0], [1, False], False),
        ({"ok": True}, {"ok": 1.0}, False),
        (float("nan"), None, False),
        ([float("inf")], [None], False),
        ({"a": 1, "b": [2.0]}, {"b": [2], "a": 1}, True),
        ({"n": [True, 0.0]}, {"n": [1, False]}, False),  # equal as Python compares them: not as values
        ({"n": [1, 2.0]}, {"n": [1.0, 2]}, True),
        ({"a": 1, "b": [None]}, {"b": [None], "a": 1.0}, True),
        ({1: "x"}, {1: "x"}, True),  # no JSON text: compared as values
    ],
)
def test_same(replayed: object, logged: object, equal: bool) -> None:
    assert same(replayed, logged) is equal


class Colour(enum.Enum):
    RED = "red"


def test_json_copy_is_the_standard_round_trip_or_refuses() -> None:
    value = {"a": [1, 2.5, None, True, "é"], "b": {"c": -(2**63)}}
    copied = json_copy(value)
    assert copied == value and copied is not value and copied["a"] is not value["a"]
    assert type(copied["a"][1]) is float and copied["a"][3] is True
    # The standard library writes these otherwise (or not at all), so the caller must run its own round trip.
    for other in ({"x": float("nan")}, {"x": float("inf")}, {"x": Colour.RED}, {"x": (1, 2)}, {1: "a"}, {"x": 2**64}):
        with pytest.raises(NotExact):
            json_copy(other)


def test_every_text_orjson_reads_is_decoded_as_json() -> None:
    # decoded() asks orjson only about text that can start a JSON value: whatever orjson reads must still be read.
    read = 0
    for prefix in ("", " ", "\n\t\r ", "\x0b", "\ufeff"):
        for first in map(chr, [*range(0x300), 0x2028, 0xFEFF]):
            for rest in ("", "1", "rue", "alse", "ull", "{}", '"x"', "]", ".5e3"):
                text = prefix + first + rest
                try:
                    value = orjson.loads(text)
                except orjson.JSONDecodeError:
                    continue
                read += 1
                assert decoded(text) == value and type(decoded(text)) is type(value), text
    assert read > 40  # numbers, strings, arrays, objects, true, false, null, after JSON whitespace


def test_text_is_never_run() -> None:
    code = "__import__('os').system('touch /tmp/pexec-owned')"
    assert decoded(code) == code  # not a literal: kept as text
    assert decoded("{1, 2}") == "{1, 2}"  # a set has no JSON value: kept as text
    assert decoded("{'a': (1, 2)}") == {"a": [1, 2]}


def test_a_repr_output_matches_in_replay() -> None:
    # The shop simulator returns {"user_id": ...}; a log that wrote its Python repr matches it.
    def run(output: str) -> bool | None:
        events = [Message("user", "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701)."),
                  Call("authenticate", {"email": "ava.lopez@example.com", "zip": "78701"}, output=output)]  # fmt: skip
        result = replay(get_environment("shop"), Rollout("r", "t", "shop", events=events))
        return result.steps[0].output_match

    assert run("{'user_id': 'U1001'}") is True
    assert run("{'user_id': 'U1002'}") is False
