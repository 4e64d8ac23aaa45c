"""Record upstream ToolSandbox's own answers to random call sequences over its 29 local tools.

tests/test_toolsandbox_diff.py replays the recorded cases through pexec's `toolsandbox` simulator and measures
how often the two agree. This script runs upstream's code as published (nothing of it is copied here): the
source is put on sys.path and its tool functions are called with keyword arguments, as upstream's execution
environment calls them, in the base scenario upstream builds, with the wall clock frozen at the sequence's
"now" and the process time zone set to the sequence's zone. A step is valid when the call returns, invalid
when it raises; the recording keeps the exception's type and message and the returned value.

How to re-record (Python 3.11; upstream commit 165848b9a78cead7ca7fe7c89c688b58e6501219 of apple/ToolSandbox,
its only commit as of 2026-11-30, with the library versions its pyproject.toml pins):

    git clone https://github.com/apple/ToolSandbox /tmp/ts-src
    git -C /tmp/ts-src checkout 165848b9a78cead7ca7fe7c89c688b58e6501219
    python3.11 -m venv /tmp/tsup
    /tmp/tsup/bin/pip install polars==0.20.31 rapidfuzz==3.9.3 pint==0.23 phonenumbers==8.13.39 \
        holidays==0.51 geopy==2.4.1 ccy==1.3.1 decorator==5.1.1 dill==0.3.8 StrEnum==0.4.15 \
        typing_extensions==4.12.2 requests==2.32.3 networkx==3.2.1 numpy==1.26.4 scipy==1.13.1 \
        rouge-score==0.1.2 langchain==0.1.3 openai==1.17.0 pydantic==2.7.4 pyyaml==6.0.1 attrs==26.1.0 tqdm==4.70.1 \
        time-machine==3.6.0
    /tmp/tsup/bin/python tests/toolsandbox_diff/record.py --upstream /tmp/ts-src \
        --seed 14 --sequences 360 --out tests/toolsandbox_diff/cases.jsonl.gz

(the venv is only for this script: the upstream modules that build the base scenario import langchain,
openai, scipy and rouge-score.) The output is gzip'd JSON lines: a provenance line, then one line per
sequence with its time zone, "now", settings variant and steps.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gzip
import importlib.metadata
import json
import os
import random
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

UPSTREAM = "https://github.com/apple/ToolSandbox"
ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")  # object addresses in messages: a re-recording repeats itself
COMMIT = "165848b9a78cead7ca7fe7c89c688b58e6501219"
LIBRARIES = ("polars", "rapidfuzz", "pint", "phonenumbers", "holidays", "geopy", "geographiclib", "time-machine")
ZONES = ("UTC", "America/Los_Angeles", "America/New_York", "Europe/Berlin", "Australia/Sydney", "Asia/Kolkata")
# US and EU daylight-saving changes, 2021-2026: "now" lands near them so the seed's day-long offsets cross one.
DST_CHANGES = ("2021-03-14", "2021-11-07", "2022-03-27", "2022-10-30", "2023-03-12", "2023-11-05", "2024-03-31",
               "2024-10-27", "2024-04-07", "2025-03-09", "2025-11-02", "2025-10-05", "2026-03-29")  # fmt: skip

SEED_CONTACTS = ("Tomas Haake", "Fredrik Thordendal", "John Petrucci", "Homer S")
SEED_MESSAGES = ("message_0", "message_1", "message_2", "message_4")
SEED_REMINDERS = ("reminder_0", "reminder_1", "reminder_2")
_SEED_REMINDER = str(uuid.uuid5(uuid.NAMESPACE_URL, "reminder_2"))
NAMES = ("Fredrik Thordendal", "Fredrik", "a", "o", "Office", "fredrik thordendal", "Thordendal Fredrik", "John",
         "Jon Petruci", "Homer", "Homer S", "homer simpson", "Tomas Haake", "Tom", "Alice Smith", "Alice", "Bob", "",
         "   ", "!!!", "Fred", "Petrucci", "Tomas", "J", "Haake Tomas")  # fmt: skip
RELATIONSHIPS = ("friend", "friends", "Friend", "boss", "Boss", "self", "coworker", "mother", "", "fr", "bos",
                 "best friend", "my boss")  # fmt: skip
PHONES = ("+12453344098", "+11233344455", "+1234560987", "+10000000000", "+18307976530", "+14155550123",
          "+1 415 555 0123", "+1 415 555 0123 ext 12", "+1-800-FLOWERS", "+44 20 7946 0958", "+1 (415) 555-0123",
          "4155550123", "12453344098", "+", "", "abc", "+999 123", "+12", "+1234567890123456789012",
          "00 44 20 7946 0958", "tel:+14155550123", "+1 415 555 0123;ext=12", "+33 1 23 45 67 89",
          "+1.415.555.0123", "+1 415 555 0123 x12", "+86 10 1234 5678", "+0 123 456", "+1 800 FLOWERS now")  # fmt: skip
CONTENTS = ("Hey kid, you want some GPU?", "GPU", "a", "Buy", "the", "o", "it", "how is it going", "How's it going",
            "Good", "tickets", "Buy tickets", "bathing dress", "navy", "", "Things are proceeding", "keep me posted",
            "random text xyz", "Look for Company SF tickets", "Merrily", "Buy milk", "Call mom", "gpu kid",
            "No leave me alone", "leave", "Buy a nice rich navy bathing dress", "SF", "company")  # fmt: skip
# Units by dimension (a conversion mostly stays within one), then odd and unknown names.
UNIT_GROUPS = (
    (
        "celsius",
        "fahrenheit",
        "degrees Fahrenheit",
        "degree Celsius",
        "degrees Celsius",
        "kelvin",
        "degC",
        "degF",
        "Celsius",
        "Fahrenheit",
        "Degrees Celsius",
        "degrees_fahrenheit",
        "Kelvin",
        "rankine",
        "degR",
    ),
    (
        "meter",
        "meters",
        "m",
        "km",
        "kilometer",
        "kilometers",
        "mile",
        "miles",
        "mi",
        "ft",
        "feet",
        "foot",
        "inch",
        "inches",
        "yard",
        "yards",
        "parsec",
        "light year",
        "lightyear",
        "light_year",
        "nautical mile",
        "nautical_mile",
        "Mile",
        "KM",
        "Meter",
        "Feet",
        "mm",
        "cm",
        "nm",
        "micrometer",
        "um",
        "µm",
    ),
    (
        "acre",
        "acres",
        "survey acre",
        "survey_acre",
        "hectare",
        "hectares",
        "square meter",
        "square_meter",
        "sq ft",
        "square feet",
        "square_foot",
        "Acre",
        "m**2",
    ),
    (
        "liter",
        "litre",
        "liters",
        "L",
        "l",
        "ml",
        "mL",
        "gallon",
        "gallons",
        "US gallon",
        "imperial gallon",
        "cup",
        "cups",
        "tablespoon",
        "teaspoon",
        "fluid ounce",
        "fluid_ounce",
        "fl oz",
        "pint",
        "quart",
        "Liter",
        "Gallons",
    ),
    (
        "kg",
        "kilogram",
        "kilograms",
        "pound",
        "pounds",
        "lb",
        "lbs",
        "ounce",
        "oz",
        "gram",
        "grams",
        "g",
        "ton",
        "tonne",
        "metric ton",
        "metric_ton",
        "stone",
        "Kilogram",
        "Pounds",
    ),
    (
        "second",
        "seconds",
        "minute",
        "minutes",
        "hour",
        "hours",
        "day",
        "days",
        "week",
        "year",
        "Hours",
        "decade",
        "century",
        "fortnight",
    ),
    (
        "mph",
        "km/h",
        "kph",
        "knot",
        "knots",
        "m/s",
        "meter per second",
        "meter / second",
        "miles per hour",
        "mile/hour",
        "kilometers per hour",
        "MPH",
    ),
    (
        "byte",
        "kilobyte",
        "MB",
        "GB",
        "joule",
        "calorie",
        "kcal",
        "watt",
        "horsepower",
        "psi",
        "pascal",
        "bar",
        "atm",
        "%",
        "percent",
        "dozen",
        "1/s",
        "parsec_banana",
        "",
        "xyz",
    ),
)
HOLIDAYS = ("Christmas", "christmas day", "Christmas Day", "Thanksgiving", "thanksgiving day",
            "independence day", "Independence Day", "July 4th", "Fourth of July", "Juneteenth", "New Year",
            "New Year's Day", "new years", "Labor Day", "Memorial", "Memorial Day", "MLK", "Martin Luther King",
            "Martin Luther King Jr. Day", "Washington's Birthday", "Presidents Day", "Columbus Day",
            "Veterans Day", "Halloween", "Easter", "", "xmas", "Independence Day (observed)",
            "Christmas Day (observed)", "observed", "day", "Veteran")  # fmt: skip


# The divergences known from upstream's tools, called by name now and then: survey acre, "degrees Fahrenheit",
# extensions and vanity numbers, holidays on a weekend (observed on the Friday or Monday), a float where an int is
# expected, an explicit null for an optional argument.
NAMED = (
    ("unit_conversion", {"amount": 1, "from_unit": "survey acre", "to_unit": "m**2"}),
    ("unit_conversion", {"amount": 2, "from_unit": "acre", "to_unit": "survey_acre"}),
    ("unit_conversion", {"amount": 100, "from_unit": "degrees Fahrenheit", "to_unit": "celsius"}),
    ("unit_conversion", {"amount": 20, "from_unit": "celsius", "to_unit": "degrees Fahrenheit"}),
    ("unit_conversion", {"amount": 212, "from_unit": "Fahrenheit", "to_unit": "Celsius"}),
    ("unit_conversion", {"amount": 5, "from_unit": "Miles", "to_unit": "Kilometers"}),
    ("add_contact", {"name": "Office", "phone_number": "+1 415 555 0123 ext 12"}),
    ("add_contact", {"name": "Flowers", "phone_number": "+1-800-FLOWERS", "relationship": None}),
    ("send_message_with_phone_number", {"phone_number": "+1-800-FLOWERS", "content": "Roses, please"}),
    ("search_contacts", {"phone_number": "+1 415 555 0123 ext 12"}),
    ("search_holiday", {"holiday_name": "Independence Day", "year": 2021}),
    ("search_holiday", {"holiday_name": "Christmas Day", "year": 2021}),
    ("search_holiday", {"holiday_name": "Christmas", "year": 2022}),
    ("search_holiday", {"holiday_name": "New Year's Day", "year": 2022}),
    ("search_holiday", {"holiday_name": "Juneteenth", "year": 2022}),
    ("search_holiday", {"holiday_name": "Veterans Day", "year": 2023}),
    ("search_holiday", {"holiday_name": "Independence Day", "year": 2026}),
    ("search_holiday", {"holiday_name": "Thanksgiving", "year": 2024.0}),
    ("datetime_info_to_timestamp", {"year": 2024, "month": 5, "day": 13.0, "hour": 9, "minute": 0, "second": 0}),
    ("datetime_info_to_timestamp", {"year": 2024.0, "month": 5, "day": 13, "hour": 9, "minute": 0, "second": 0}),
    ("search_contacts", {"name": None}),
    ("search_contacts", {"relationship": None, "is_self": True}),
    ("add_reminder", {"content": "Buy milk", "reminder_timestamp": 1717600000.0, "latitude": None}),
    ("modify_reminder", {"reminder_id": _SEED_REMINDER, "latitude": None, "longitude": None}),
)


class Generator:
    """Random call sequences: mostly valid calls over ids the sequence knows, plus edge cases (nulls for
    optional parameters, floats where integers are expected, boundary values, odd phone numbers and units) and
    invalid calls (a missing or unknown parameter, a wrong type)."""

    def __init__(self, rng: random.Random, now: float) -> None:
        self.rng, self.now = rng, now
        self.person_ids = [_seed_id(p) for p in SEED_CONTACTS]
        self.message_ids = [_seed_id(p) for p in SEED_MESSAGES]
        self.reminder_ids = [_seed_id(p) for p in SEED_REMINDERS]

    def pick(self, values: Any) -> Any:
        return self.rng.choice(list(values))

    def learn(self, tool: str, output: Any) -> None:
        if isinstance(output, str):
            {"add_contact": self.person_ids, "send_message_with_phone_number": self.message_ids,
             "add_reminder": self.reminder_ids}.get(tool, []).append(output)  # fmt: skip

    def an_id(self, known: list[str]) -> str:
        r = self.rng.random()
        if r < 0.85:
            return self.pick(known)
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4)) if r < 0.95 else ""  # unknown, empty

    def timestamp(self) -> Any:
        r = self.rng.random()
        if r < 0.7:
            return round(self.now + self.rng.uniform(-5, 5) * 86400, self.rng.choice((0, 1, 3)))
        if r < 0.8:
            return int(self.now + self.rng.randint(-400000, 400000))
        return self.pick((315529200.0, 2524604400.0, 315529199.0, 2524604401, self.now * 1000, -1.0, 0, 1e10))

    def latitude(self) -> Any:
        if self.rng.random() < 0.8:
            return round(self.rng.uniform(-90, 90), self.rng.choice((0, 2, 6)))
        return self.pick((90, -90.0, 90.0001, -91, 37.3237926356735, 0))

    def longitude(self) -> Any:
        if self.rng.random() < 0.8:
            return round(self.rng.uniform(-180, 180), self.rng.choice((0, 2, 6)))
        return self.pick((180, -180.0, 180.5, -181, -122.03961770355414, 0))

    def integer(self, low: int, high: int, edges: tuple[Any, ...]) -> Any:
        r = self.rng.random()
        if r < 0.93:
            return self.rng.randint(low, high)
        if r < 0.97:
            return float(self.rng.randint(low, high))  # 13.0 where an int is expected
        return self.pick(edges)

    def conversion(self) -> dict[str, Any]:
        group = self.pick(UNIT_GROUPS)
        other = group if self.rng.random() < 0.75 else self.pick(UNIT_GROUPS)
        amount = self.pick((0, 1, 100, -40, 3.5, 1e6, 32.0, 2, 12.5, 0.001, 5280))
        return {"amount": amount, "from_unit": self.pick(group), "to_unit": self.pick(other)}

    def call(self, tools: list[str]) -> tuple[str, dict[str, Any], bool]:
        """A tool, its arguments, and whether it is one of the NAMED calls."""
        if self.rng.random() < 0.06:
            tool, args = self.pick(NAMED)
            return tool, dict(args), True
        tool = self.pick(tools)
        return tool, self.arguments(tool), False

    def addition(self) -> tuple[str, dict[str, Any], bool]:
        """A valid add: a run of them first grows the tables past what a fuzzy search keeps."""
        valid_phones = [p for p in PHONES if p.startswith("+1") and len(p) >= 12]
        tool = self.pick(("add_contact", "add_reminder", "send_message_with_phone_number"))
        args = {"add_contact": {"name": self.pick(NAMES), "phone_number": self.pick(valid_phones),
                                "relationship": self.pick(RELATIONSHIPS)},
                "add_reminder": {"content": self.pick(CONTENTS),
                                 "reminder_timestamp": round(self.now + self.rng.uniform(-3, 3) * 86400, 1)},
                "send_message_with_phone_number": {"phone_number": self.pick(valid_phones),
                                                   "content": self.pick(CONTENTS)}}[tool]  # fmt: skip
        return tool, args, False

    def arguments(self, tool: str) -> dict[str, Any]:
        rng, pick = self.rng, self.pick
        year = lambda: self.integer(2019, 2031, (None, 1900, 0, -1, 10000, 1776, 2024.5))  # noqa: E731
        opt = lambda p, make: make() if rng.random() < p else None  # noqa: E731
        builders = {
            "add_contact": lambda: {"name": pick(NAMES), "phone_number": pick(PHONES),
                                    "relationship": opt(0.8, lambda: pick(RELATIONSHIPS)),
                                    "is_self": opt(0.3, lambda: rng.random() < 0.2)},
            "modify_contact": lambda: {"person_id": self.an_id(self.person_ids), "name": opt(0.4, lambda: pick(NAMES)),
                                       "phone_number": opt(0.3, lambda: pick(PHONES)),
                                       "relationship": opt(0.3, lambda: pick(RELATIONSHIPS)),
                                       "is_self": opt(0.2, lambda: rng.random() < 0.5)},
            "remove_contact": lambda: {"person_id": self.an_id(self.person_ids)},
            "search_contacts": lambda: {"person_id": opt(0.2, lambda: self.an_id(self.person_ids)),
                                        "name": opt(0.5, lambda: pick(NAMES)),
                                        "phone_number": opt(0.2, lambda: pick(PHONES)),
                                        "relationship": opt(0.3, lambda: pick(RELATIONSHIPS)),
                                        "is_self": opt(0.3, lambda: rng.random() < 0.5)},
            "send_message_with_phone_number": lambda: {"phone_number": pick(PHONES), "content": pick(CONTENTS)},
            "search_messages": lambda: {
                "message_id": opt(0.15, lambda: self.an_id(self.message_ids)),
                "sender_person_id": opt(0.15, lambda: self.an_id(self.person_ids)),
                "sender_phone_number": opt(0.15, lambda: pick(PHONES)),
                "recipient_person_id": opt(0.15, lambda: self.an_id(self.person_ids)),
                "recipient_phone_number": opt(0.15, lambda: pick(PHONES)),
                "content": opt(0.5, lambda: pick(CONTENTS)),
                "creation_timestamp_lowerbound": opt(0.2, self.timestamp),
                "creation_timestamp_upperbound": opt(0.2, self.timestamp)},
            "add_reminder": lambda: {"content": pick(CONTENTS), "reminder_timestamp": self.timestamp(),
                                     "latitude": opt(0.3, self.latitude), "longitude": opt(0.3, self.longitude)},
            "modify_reminder": lambda: {"reminder_id": self.an_id(self.reminder_ids),
                                        "content": opt(0.4, lambda: pick(CONTENTS)),
                                        "reminder_timestamp": opt(0.4, self.timestamp),
                                        "latitude": opt(0.2, self.latitude), "longitude": opt(0.2, self.longitude)},
            "search_reminder": lambda: {
                "reminder_id": opt(0.2, lambda: self.an_id(self.reminder_ids)),
                "content": opt(0.5, lambda: pick(CONTENTS)),
                "creation_timestamp_lowerbound": opt(0.15, self.timestamp),
                "creation_timestamp_upperbound": opt(0.15, self.timestamp),
                "reminder_timestamp_lowerbound": opt(0.15, self.timestamp),
                "reminder_timestamp_upperbound": opt(0.15, self.timestamp),
                "latitude": opt(0.1, lambda: pick((37.3237926356735, 37.3237926356735, 10.0))),
                "longitude": opt(0.1, lambda: pick((-122.03961770355414, -122.03961770355414, 10)))},
            "remove_reminder": lambda: {"reminder_id": self.an_id(self.reminder_ids)},
            "timestamp_to_datetime_info": lambda: {"timestamp": self.timestamp()},
            "datetime_info_to_timestamp": lambda: {
                "year": year(), "month": self.integer(1, 12, (0, 13, -1)), "day": self.integer(1, 31, (0, 32)),
                "hour": self.integer(0, 23, (24, -1)), "minute": self.integer(0, 59, (60,)),
                "second": self.integer(0, 59, (60, 59.5))},
            "shift_timestamp": lambda: {"timestamp": self.timestamp(),
                                        **{k: self.integer(-30, 30, (1.5, 10**9, None, True)) for k in
                                           ("weeks", "days", "hours", "minutes", "seconds") if rng.random() < 0.35}},
            "timestamp_diff": lambda: {"timestamp_0": self.timestamp(), "timestamp_1": self.timestamp()},
            "seconds_to_hours_minutes_seconds": lambda: {"seconds": pick((
                rng.randint(0, 86399), float(rng.randint(0, 86399)), rng.uniform(0, 86400), -1, -3600.5, 1e12,
                1e20, 90061, self.now))},
            "unit_conversion": self.conversion,
            "calculate_lat_lon_distance": lambda: {"latitude_0": self.latitude(), "longitude_0": self.longitude(),
                                                   "latitude_1": self.latitude(), "longitude_1": self.longitude()},
            "search_holiday": lambda: {"holiday_name": pick(HOLIDAYS), "year": opt(0.85, year)},
            **{f"set_{s}_status": (lambda: {"on": rng.random() < 0.5})
               for s in ("low_battery_mode", "location_service", "cellular_service", "wifi")},
        }  # fmt: skip
        # Searches that list whole tables, in table order (where a modified row moved to the end) or by a score
        # many rows reach (past the five a fuzzy search keeps).
        broad = {
            "search_contacts": ({"is_self": False}, {"name": "a"}, {"name": "e"}),
            "search_messages": ({"creation_timestamp_lowerbound": round(self.now - 10 * 86400, 1)}, {"content": "a"},
                                {"content": "e"}),
            "search_reminder": ({"reminder_timestamp_lowerbound": round(self.now - 10 * 86400, 1)},
                                {"content": "a"}, {"content": "e"}),
        }  # fmt: skip
        if tool in broad and rng.random() < 0.3:
            return dict(pick(broad[tool]))
        args = builders.get(tool, dict)()
        # Optional parameters: mostly left out, sometimes sent as an explicit null.
        args = {k: v for k, v in args.items() if v is not None or rng.random() < 0.08}
        r = rng.random()
        if r < 0.03 and args:
            del args[pick(sorted(args))]  # a missing (maybe required) parameter
        elif r < 0.05:
            args["extra"] = 1  # an unknown parameter
        elif r < 0.09 and args:
            key = pick(sorted(args))
            args[key] = pick(("12", 12, 1.5, True, [], None, {"a": 1}))  # a wrong type
        return args


def _seed_id(payload: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, payload))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _now(rng: random.Random) -> float:
    if rng.random() < 0.4:  # near a daylight-saving change
        day = dt.datetime.fromisoformat(rng.choice(DST_CHANGES)).replace(tzinfo=dt.UTC).timestamp()
        return round(day + rng.uniform(-4.5, 4.5) * 86400, 3)
    return round(rng.uniform(1577836800, 1893456000), 3)  # 2020 .. 2030


def record(upstream: Path, seed: int, sequences: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(upstream))
    import time_machine
    import tool_sandbox.tools
    from tool_sandbox.common.execution_context import set_current_context
    from tool_sandbox.common.tool_discovery import ToolBackend, find_tools_by_module
    from tool_sandbox.scenarios.base_scenarios import named_base_scenarios

    rng = random.Random(seed)
    # Upstream's created ids are uuid4: drawn from the seeded generator so a re-recording repeats itself.
    for module in ("contact", "messaging", "reminder"):
        getattr(tool_sandbox.tools, module).uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)
    tools = find_tools_by_module(tool_sandbox.tools, ToolBackend.DEFAULT)
    local = sorted(name for name, f in tools.items() if f.__module__ != "tool_sandbox.tools.rapid_api_search_tools")
    assert len(local) == 29, local
    # The table tools (contacts, messages, reminders) three times as often as the rest: tables grow past the
    # five hits a fuzzy search keeps, and searches see rows that were modified (moved to the end) or removed.
    table = {
        "add_contact",
        "modify_contact",
        "remove_contact",
        "search_contacts",
        "send_message_with_phone_number",
        "search_messages",
        "add_reminder",
        "modify_reminder",
        "search_reminder",
        "remove_reminder",
    }
    agent_tools = [t for t in local if t != "end_conversation" for _ in range(3 if t in table else 1)]
    out = []
    for index in range(sequences):
        zone, now = rng.choice(ZONES), _now(rng)
        os.environ["TZ"] = zone
        time.tzset()
        with time_machine.travel(now, tick=False):
            scenarios = named_base_scenarios(ToolBackend.DEFAULT)
            variant = rng.choice(sorted(scenarios))
            set_current_context(copy.deepcopy(scenarios[variant].starting_context))
            gen = Generator(rng, now)
            steps = []
            length = rng.randint(6, 24)
            grow = rng.randint(4, 10) if rng.random() < 0.35 else 0
            for position in range(length):
                last = position == length - 1
                end = last and rng.random() < 0.3
                if end:
                    tool, args, named = "end_conversation", {}, False
                else:
                    tool, args, named = gen.addition() if position < grow else gen.call(agent_tools)
                step: dict[str, Any] = {"tool": tool, "arguments": args, "named": named}
                try:
                    output = tools[tool](**args)
                except Exception as exc:  # upstream's console turns any exception into the tool message
                    message = ADDRESS.sub("", str(exc))[:300]
                    step |= {"raised": True, "exception": type(exc).__name__, "message": message}
                else:
                    step |= {"raised": False, "output": _jsonable(output)}
                    gen.learn(tool, output)
                steps.append(step)
        out.append({"sequence": index, "tz": zone, "now": now, "settings": variant, "steps": steps})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="a checkout of apple/ToolSandbox")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--sequences", type=int, default=360)
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    cases = record(a.upstream, a.seed, a.sequences)
    provenance = {
        "upstream": UPSTREAM, "commit": COMMIT, "seed": a.seed, "sequences": a.sequences,
        "steps": sum(len(c["steps"]) for c in cases), "recorded": dt.datetime.now(dt.UTC).date().isoformat(),
        "python": sys.version.split()[0], "libraries": {n: importlib.metadata.version(n) for n in LIBRARIES},
        "script": "tests/toolsandbox_diff/record.py",
    }  # fmt: skip
    lines = [json.dumps({"provenance": provenance})] + [json.dumps(c, sort_keys=True) for c in cases]
    with gzip.GzipFile(a.out, "wb", mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    print(f"{a.out}: {provenance['steps']} steps in {a.sequences} sequences")


if __name__ == "__main__":
    main()
