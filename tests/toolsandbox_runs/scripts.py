"""What the stub model plays in each recorded scenario (record.py): the agent's and the simulated user's turns.

Chosen so that, over the scenarios, all 29 local tools are called (end_conversation by the user), some scenarios
pass their milestones and some fail them, several take more than one user turn, calls raise in upstream's tools
(a precondition, a bad id, a value out of range, a float for an int), one turn makes parallel calls, and three
scenarios crash: the stub drops the connection on the agent's first request, and mid-run, and the agent names a
tool the scenario does not allow (upstream raises KeyError before executing anything).
"""

from __future__ import annotations

from typing import Any

from stub_model import Calls, Drop, Say, Script, call, output_of

FREDRIK = "+12453344098"
GOLDEN_GATE = (37.8199, -122.4783)


def _now(m: list[dict[str, Any]]) -> float:
    return output_of("get_current_timestamp", m)


def _christmas_diff(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"timestamp_0": _now(m), "timestamp_1": output_of("search_holiday", m)}


def _seconds(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"seconds": output_of("timestamp_diff", m)["seconds"]}


def _tomorrow(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"timestamp": _now(m), "days": 1}


def _tomorrow_info(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"timestamp": output_of("shift_timestamp", m)}


def _tomorrow_5pm(m: list[dict[str, Any]]) -> dict[str, Any]:
    info = output_of("timestamp_to_datetime_info", m)
    return {k: info[k] for k in ("year", "month", "day")} | {"hour": 17, "minute": 0, "second": 0}


def _add_milk(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": "Buy chocolate milk", "reminder_timestamp": output_of("datetime_info_to_timestamp", m)}


def _rename_added(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"reminder_id": output_of("add_reminder", m), "content": "Buy chocolate milk"}


def _first_found(tool: str, key: str, argument: str) -> Any:
    return lambda m: {argument: output_of(tool, m)[0][key]}


def _here_to_golden_gate(m: list[dict[str, Any]]) -> dict[str, Any]:
    here = output_of("get_current_location", m)
    return {"latitude_0": here["latitude"], "longitude_0": here["longitude"],
            "latitude_1": GOLDEN_GATE[0], "longitude_1": GOLDEN_GATE[1]}  # fmt: skip


def _upcoming(m: list[dict[str, Any]]) -> dict[str, Any]:
    return {"reminder_timestamp_lowerbound": _now(m)}


# Recorded first, in a run folder of their own that is also unpacked into tests/data/toolsandbox (the manual's
# example): one scenario that passes, one that fails its milestones, a multi-turn one, a crash mid-run.
SAMPLE = (
    "send_message_with_contact_content_cellular_off",
    "add_reminder_content_and_date_and_time_multiple_user_turn",
    "find_temperature_f_with_location_all_tools",
    "find_current_city_low_battery_mode",
)

SEND = call("send_message_with_phone_number", phone_number=FREDRIK, content="How's the new album coming along.")

SCRIPTS: tuple[Script, ...] = (
    Script(
        "send_message_with_contact_content_cellular_off",
        (
            Calls((call("search_contacts", name="Fredrik Thordendal"),)),
            Calls((SEND,)),  # raises: cellular service is off
            Calls((call("get_cellular_service_status"),)),
            Calls((call("set_cellular_service_status", on=True),)),
            Calls((SEND,)),
            Say("Your message to Fredrik Thordendal has been sent."),
        ),
    ),
    Script(
        "turn_on_wifi_low_battery_mode",
        (
            Calls((call("set_wifi_status", on=True),)),  # raises: low battery mode
            Calls((call("get_low_battery_mode_status"),)),
            Calls((call("set_low_battery_mode_status", on=False),)),
            Calls((call("set_wifi_status", on=True),)),
            Calls((call("get_wifi_status"),)),
            Say("Wifi is on now; I turned low battery mode off first."),
        ),
    ),
    Script(
        "turn_on_location_low_battery_mode_all_tools",
        (
            Calls((call("get_location_service_status"),)),
            Calls((call("get_current_location"),)),  # raises: location service is off
            Calls((call("set_location_service_status", on=True),)),  # raises: low battery mode
            Calls((call("set_low_battery_mode_status", on=False),)),
            Calls((call("set_location_service_status", on=True),)),
            Calls((call("get_current_location"),)),
            Calls((("calculate_lat_lon_distance", _here_to_golden_gate),)),
            Say("Location service is on."),
        ),
    ),
    Script(
        "find_days_till_holiday_all_tools",
        (
            Calls((call("get_current_timestamp"),)),
            Calls((call("search_holiday", holiday_name="Christmas Day"),)),
            Calls((("timestamp_diff", _christmas_diff),)),
            Calls((("seconds_to_hours_minutes_seconds", _seconds),)),
            Calls((call("search_holiday", holiday_name="Christmas Day", year=2024.0),)),  # raises: a float year
            Say("Christmas Day is a few weeks away."),
        ),
    ),
    Script(
        "find_days_till_holiday_wifi_off",
        (
            Calls((call("get_current_timestamp"),)),
            Calls((call("search_holiday", holiday_name="Christmas Day"),)),  # raises: wifi is off
            Calls((call("get_wifi_status"),)),
            Calls((call("set_wifi_status", on=True),)),
            Calls((call("search_holiday", holiday_name="Christmas Day"),)),
            Calls((("timestamp_diff", _christmas_diff),)),
            Say("It is some days till Christmas Day."),
        ),
    ),
    Script(
        "add_reminder_content_and_week_delta_and_time_all_tools",
        (
            Calls((call("get_current_timestamp"),)),
            Calls((("shift_timestamp", _tomorrow),)),
            Calls((("timestamp_to_datetime_info", _tomorrow_info),)),
            Calls((("datetime_info_to_timestamp", _tomorrow_5pm),)),
            Calls((("add_reminder", _add_milk),)),
            Calls((("modify_reminder", _rename_added),)),
            Say("I added a reminder to buy chocolate milk tomorrow at 5PM."),
        ),
    ),
    Script(
        "remove_reminder_with_recency_latest_all_tools",
        (
            Calls((call("get_current_timestamp"),)),
            Calls((("search_reminder", _upcoming),)),
            Calls((call("remove_reminder", reminder_id="reminder-that-does-not-exist"),)),  # raises: no such id
            Calls((("remove_reminder", _first_found("search_reminder", "reminder_id", "reminder_id")),)),
            Say("Your upcoming reminder is removed."),
        ),
    ),
    Script(
        "search_reminder_with_recency_upcoming_all_tools",
        (
            Calls((call("get_current_timestamp"),)),
            Calls((("timestamp_to_datetime_info", lambda m: {"timestamp": _now(m) * 1e6}),)),  # raises: range
            Calls((call("add_reminder", content="Check tires", reminder_timestamp=1e9, latitude=91.0),)),  # raises
            Calls((call("datetime_info_to_timestamp", year=2024, month=5, day=13.5, hour=9, minute=0, second=0),)),
            Calls((("search_reminder", _upcoming),)),
            Say("Your upcoming reminder is to buy tickets for Merrily next week."),
        ),
    ),
    Script(
        "update_contact_relationship_with_relationship",
        (
            Calls((call("search_contacts", relationship="friend"),)),
            Calls(  # parallel calls: upstream executes every order of them
                (
                    (
                        "modify_contact",
                        lambda m: {
                            "person_id": output_of("search_contacts", m)[0]["person_id"],
                            "relationship": "enemy",
                        },
                    ),
                    (
                        "modify_contact",
                        lambda m: {
                            "person_id": output_of("search_contacts", m)[1]["person_id"],
                            "relationship": "enemy",
                        },
                    ),
                )
            ),
            Say("Both of your friends are now your enemies."),
        ),
    ),
    Script(
        "add_contact_with_name_and_phone_number",
        (
            Calls((call("add_contact", name="Stephen Sondheim", phone_number="+19876543210"),)),
            Say("Stephen Sondheim is in your contacts now."),
        ),
    ),
    Script(
        "remove_contact_by_phone_all_tools",
        (
            Calls((call("search_contacts", phone_number=FREDRIK),)),
            Calls((call("remove_contact", person_id="not-a-real-person"),)),  # raises: no such id
            Calls((("remove_contact", _first_found("search_contacts", "person_id", "person_id")),)),
            Say("Removed."),
        ),
    ),
    Script(
        "find_temperature_f_with_location_all_tools",
        (
            Calls((call("unit_conversion", amount=20, from_unit="celsius", to_unit="fahrenheit"),)),
            Calls((call("unit_conversion", amount=20, from_unit="celsius", to_unit="parsec_banana"),)),  # raises
            Say("It is 68 degrees Fahrenheit in the Grand Canyon."),  # a guess: fails the milestones
        ),
    ),
    Script(
        "search_message_with_recency_latest_multiple_user_turn",
        (
            Say("Sure. Which message are you looking for?"),
            Calls((call("get_current_timestamp"),)),
            Calls((("search_messages", lambda m: {"creation_timestamp_upperbound": _now(m)}),)),
            Say("Your most recent message says 'Good, keep me posted'."),
        ),
        user=(Say("The latest one I got."),),
    ),
    Script(
        "send_message_with_contact_content_cellular_off_multiple_user_turn",
        (
            Say("Who should I send it to, and what should it say?"),
            Calls((call("search_contacts", name="Fredrik Thordendal"),)),
            Calls((SEND,)),  # raises: cellular service is off
            Calls((call("set_cellular_service_status", on=True),)),
            Calls((SEND,)),
            Say("Sent."),
        ),
        user=(Say("To Fredrik Thordendal: How's the new album coming along."),),
    ),
    Script(
        "add_reminder_content_and_date_and_time_multiple_user_turn",
        (
            Say("When should I remind you?"),
            Say("Do you mean March 22, 2024 at 5 PM?"),
            Calls((call("datetime_info_to_timestamp", year=2024, month=3, day=22, hour=17, minute=0, second=0),)),
            Calls((("add_reminder", _add_milk),)),
            Say("Reminder added."),
        ),
        user=(Say("3/22/2024 5PM"), Say("Yes.")),
    ),
    Script(
        "find_days_till_holiday_insufficient_information",
        (Say("I cannot tell today's date with the tools I have, so I cannot count the days till Christmas."),),
    ),
    Script(
        "get_wifi",
        (Drop(),),
        note="the connection drops on the agent's first request: a crash before any call",
        crash="APIConnectionError",
    ),
    Script(
        "find_current_city_low_battery_mode",
        (
            Calls((call("get_low_battery_mode_status"),)),
            Calls((call("set_low_battery_mode_status", on=False),)),
            Drop(),
        ),
        note="the connection drops mid-run, after two calls",
        crash="APIConnectionError",
    ),
    Script(
        "get_cellular",
        (Calls((call("get_wifi_status"),)),),
        note="the agent names a tool the scenario does not allow: upstream raises KeyError",
        crash="KeyError",
    ),
)
