"""The utility tools' arithmetic, with the libraries upstream uses at the versions it pins: calendar fields in the
scenario's time zone (upstream computes on naive local datetimes: wall-clock arithmetic, where a day is not
always 86,400 s), units (pint), US holidays (holidays), the geodesic distance (geopy) and phone numbers
(phonenumbers). Whatever a library raises on an agent's value rejects the call with the exception's name and
message, as upstream's tool would fail."""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import Any, TypedDict
from zoneinfo import ZoneInfo

import holidays
import phonenumbers
import pint

from pipeline.envs.toolsandbox._text import partial_score

# The distributions the tool bodies call (at upstream's pins, pint at the nearest that imports beside numpy 2).
LIBRARIES = ("geopy", "holidays", "phonenumbers", "pint", "rapidfuzz")


class ToolError(Exception):
    """The tool body raised: the call is rejected with this message."""


def _failed(exc: Exception) -> ToolError:
    return ToolError(f"{type(exc).__name__}: {exc}")


def local(ts: float, tz: ZoneInfo) -> dt.datetime:
    try:
        return dt.datetime.fromtimestamp(ts, tz)
    except (OverflowError, OSError, ValueError) as exc:
        raise _failed(exc) from exc


def _timestamp(wall: dt.datetime, tz: ZoneInfo) -> float:
    # A wall-clock time read in `tz` with fold=0, as a naive local datetime's .timestamp() reads it upstream.
    return wall.replace(tzinfo=tz, fold=0).timestamp()


class DatetimeInfo(TypedDict):
    """`timestamp_to_datetime_info`'s output: the local date and time of a timestamp."""

    year: int
    month: int
    day: int
    hour: int
    minute: int
    second: int
    isoweekday: int


def datetime_info(ts: float, tz: ZoneInfo) -> DatetimeInfo:
    d = local(ts, tz)
    return {"year": d.year, "month": d.month, "day": d.day, "hour": d.hour, "minute": d.minute,
            "second": d.second, "isoweekday": d.isoweekday()}  # fmt: skip


def to_timestamp(year: int, month: int, day: int, hour: int, minute: int, second: int, tz: ZoneInfo) -> float:
    try:
        return _timestamp(dt.datetime(year, month, day, hour, minute, second), tz)
    except (ValueError, OverflowError, OSError) as exc:
        raise _failed(exc) from exc


def shift(ts: float, deltas: dict[str, float], tz: ZoneInfo) -> float:
    try:
        return _timestamp(local(ts, tz).replace(tzinfo=None) + dt.timedelta(**deltas), tz)
    except (ValueError, OverflowError, OSError) as exc:
        raise _failed(exc) from exc


def diff(ts0: float, ts1: float, tz: ZoneInfo) -> dict[str, int]:
    delta = local(ts1, tz).replace(tzinfo=None) - local(ts0, tz).replace(tzinfo=None)
    return {"days": delta.days, "seconds": delta.seconds}


@cache
def _units() -> pint.UnitRegistry:
    return pint.UnitRegistry()  # pint's default definitions, as upstream's pint.Quantity uses (built once: ~0.3 s)


def convert(amount: float, from_unit: str, to_unit: str) -> float:
    """pint's conversion; an undefined unit name is tried again in lower case, as upstream does."""
    quantity = _units().Quantity
    try:
        try:
            return float(quantity(amount, from_unit).to(to_unit).magnitude)  # a plain float, not numpy's
        except pint.UndefinedUnitError:
            return float(quantity(amount, from_unit.lower()).to(to_unit.lower()).magnitude)
    except Exception as exc:  # pint parses the agent's text: anything it raises fails the call
        raise _failed(exc) from exc


def holiday(name: str, year: int, tz: ZoneInfo) -> float | None:
    """Midnight (in `tz`) of the US holiday whose name best matches `name` (partial ratio above 90), observed days
    included; on a tie the later date wins, as upstream ranks (score, date, name) descending."""
    try:
        calendar = holidays.country_holidays(country="US", years=year)
        ranked = sorted(((partial_score(name, n), d, n) for d, n in calendar.items()), reverse=True)
    except Exception as exc:  # the library judges the agent's year
        raise _failed(exc) from exc
    if ranked and ranked[0][0] > 90:
        return _timestamp(dt.datetime.combine(ranked[0][1], dt.time()), tz)
    return None


def geodesic_km(lat0: float, lon0: float, lat1: float, lon1: float) -> float:
    import geopy.distance  # here, not at the top: geopy's package import loads its geocoders (~0.3 s)

    try:
        km: float = geopy.distance.distance((lat0, lon0), (lat1, lon1)).kilometers
        return km
    except (ValueError, TypeError) as exc:
        raise _failed(exc) from exc


def check_phone(value: Any) -> None:
    """libphonenumber's parse without a default region: a number needs its international prefix."""
    try:
        phonenumbers.parse(value)
    except phonenumbers.NumberParseException as exc:
        raise _failed(exc) from exc
