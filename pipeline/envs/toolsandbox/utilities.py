"""The utility tools' arithmetic: calendar fields in the scenario's time zone, units, US holidays and the
geodesic distance. Upstream uses pint, holidays and geopy; these are small native equivalents."""

from __future__ import annotations

import datetime as dt
import math
from zoneinfo import ZoneInfo

from pipeline.envs.toolsandbox.text import normalize, partial_ratio


class ToolError(Exception):
    """The tool body raised: the call is rejected with this message."""


def local(ts: float, tz: ZoneInfo) -> dt.datetime:
    try:
        return dt.datetime.fromtimestamp(ts, tz)
    except (OverflowError, OSError, ValueError) as exc:
        raise ToolError(f"ValueError: {exc}") from exc


def datetime_info(ts: float, tz: ZoneInfo) -> dict[str, int]:
    d = local(ts, tz)
    return {"year": d.year, "month": d.month, "day": d.day, "hour": d.hour, "minute": d.minute,
            "second": d.second, "isoweekday": d.isoweekday()}  # fmt: skip


def to_timestamp(fields: dict[str, int], tz: ZoneInfo) -> float:
    try:
        return dt.datetime(tzinfo=tz, **fields).timestamp()
    except (ValueError, OverflowError) as exc:
        raise ToolError(f"ValueError: {exc}") from exc


def shift(ts: float, deltas: dict[str, int], tz: ZoneInfo) -> float:
    # Wall-clock arithmetic, as upstream does on naive local datetimes.
    moved = local(ts, tz).replace(tzinfo=None) + dt.timedelta(**deltas)
    return moved.replace(tzinfo=tz).timestamp()


def diff(ts0: float, ts1: float, tz: ZoneInfo) -> dict[str, int]:
    delta = local(ts1, tz).replace(tzinfo=None) - local(ts0, tz).replace(tzinfo=None)
    return {"days": delta.days, "seconds": delta.seconds}


# --- units: name -> (dimension, factor to the base unit); temperatures are affine, handled apart.
_UNITS: dict[str, tuple[str, float]] = {}
for _dim, _table in {
    "length": {"meter": 1, "kilometer": 1e3, "centimeter": 1e-2, "millimeter": 1e-3, "mile": 1609.344,
               "yard": 0.9144, "foot": 0.3048, "inch": 0.0254, "nautical_mile": 1852},
    "mass": {"kilogram": 1, "gram": 1e-3, "milligram": 1e-6, "pound": 0.45359237, "ounce": 0.028349523125,
             "ton": 907.18474, "metric_ton": 1000, "stone": 6.35029318},
    "volume": {"liter": 1, "milliliter": 1e-3, "gallon": 3.785411784, "quart": 0.946352946, "pint": 0.473176473,
               "cup": 0.2365882365, "fluid_ounce": 0.0295735295625, "cubic_meter": 1000},
    "time": {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800, "millisecond": 1e-3},
    "speed": {"meter_per_second": 1, "kilometer_per_hour": 1 / 3.6, "mile_per_hour": 0.44704, "knot": 1852 / 3600},
    "area": {"square_meter": 1, "square_kilometer": 1e6, "square_foot": 0.09290304, "acre": 4046.8564224,
             "hectare": 1e4, "square_mile": 2589988.110336},
}.items():  # fmt: skip
    for _name, _factor in _table.items():
        _UNITS[_name] = (_dim, float(_factor))
_ALIASES = {"m": "meter", "km": "kilometer", "cm": "centimeter", "mm": "millimeter", "mi": "mile", "yd": "yard",
            "ft": "foot", "feet": "foot", "in": "inch", "kg": "kilogram", "g": "gram", "mg": "milligram",
            "lb": "pound", "lbs": "pound", "oz": "ounce", "l": "liter", "ml": "milliliter", "gal": "gallon",
            "s": "second", "sec": "second", "min": "minute", "h": "hour", "hr": "hour", "mph": "mile_per_hour",
            "kph": "kilometer_per_hour", "km/h": "kilometer_per_hour", "kmh": "kilometer_per_hour",
            "c": "celsius", "degc": "celsius", "degree_celsius": "celsius", "f": "fahrenheit",
            "degf": "fahrenheit", "degree_fahrenheit": "fahrenheit", "k": "kelvin", "metre": "meter",
            "litre": "liter", "kilometre": "kilometer"}  # fmt: skip
_TEMPERATURE = {"celsius": (1.0, 273.15), "fahrenheit": (5 / 9, 273.15 - 32 * 5 / 9), "kelvin": (1.0, 0.0)}


def _unit(name: str) -> str:
    key = name.strip().lower().replace(" ", "_")
    key = _ALIASES.get(key, key)
    if key not in _UNITS and key not in _TEMPERATURE and key.endswith("s") and key[:-1] in _UNITS:
        key = key[:-1]  # plurals
    key = key.replace("degrees_", "").replace("degree_", "")
    key = _ALIASES.get(key, key)
    if key not in _UNITS and key not in _TEMPERATURE:
        raise ToolError(f"UndefinedUnitError: '{name}' is not defined in the unit registry")
    return key


def convert(amount: float, from_unit: str, to_unit: str) -> float:
    src, dst = _unit(from_unit), _unit(to_unit)
    if src in _TEMPERATURE and dst in _TEMPERATURE:
        (a, b), (c, d) = _TEMPERATURE[src], _TEMPERATURE[dst]
        return (amount * a + b - d) / c
    if src in _TEMPERATURE or dst in _TEMPERATURE or _UNITS[src][0] != _UNITS[dst][0]:
        raise ToolError(f"DimensionalityError: Cannot convert from '{from_unit}' to '{to_unit}'")
    return amount * _UNITS[src][1] / _UNITS[dst][1]


# --- US federal holidays (the `holidays` package's US calendar, without observed-day entries).
def _nth_weekday(year: int, month: int, weekday: int, n: int) -> dt.date:
    first = dt.date(year, month, 1)
    if n > 0:
        return first + dt.timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))
    last = (dt.date(year + (month == 12), month % 12 + 1, 1)) - dt.timedelta(days=1)
    return last - dt.timedelta(days=(last.weekday() - weekday) % 7)


def us_holidays(year: int) -> dict[dt.date, str]:
    days = {
        dt.date(year, 1, 1): "New Year's Day",
        _nth_weekday(year, 1, 0, 3): "Martin Luther King Jr. Day",
        _nth_weekday(year, 2, 0, 3): "Washington's Birthday",
        _nth_weekday(year, 5, 0, -1): "Memorial Day",
        dt.date(year, 7, 4): "Independence Day",
        _nth_weekday(year, 9, 0, 1): "Labor Day",
        _nth_weekday(year, 10, 0, 2): "Columbus Day",
        dt.date(year, 11, 11): "Veterans Day",
        _nth_weekday(year, 11, 3, 4): "Thanksgiving",
        dt.date(year, 12, 25): "Christmas Day",
    }
    if year >= 2021:
        days[dt.date(year, 6, 19)] = "Juneteenth National Independence Day"
    return days


def holiday(name: str, year: int, tz: ZoneInfo) -> float | None:
    query = normalize(name)
    scored = sorted(((partial_ratio(query, normalize(n)), d) for d, n in us_holidays(year).items()), reverse=True)
    if scored and scored[0][0] > 90:
        return dt.datetime.combine(scored[0][1], dt.time(), tz).timestamp()
    return None


def geodesic_km(lat0: float, lon0: float, lat1: float, lon1: float) -> float:
    """WGS-84 ellipsoidal distance (Vincenty's inverse formula; agrees with geopy's geodesic to < 1 mm)."""
    a, f = 6378137.0, 1 / 298.257223563
    b = a * (1 - f)
    u1, u2 = math.atan((1 - f) * math.tan(math.radians(lat0))), math.atan((1 - f) * math.tan(math.radians(lat1)))
    big_l = math.radians(lon1 - lon0)
    lam = big_l
    for _ in range(200):
        sin_l, cos_l = math.sin(lam), math.cos(lam)
        sin_s = math.hypot(math.cos(u2) * sin_l, math.cos(u1) * math.sin(u2) - math.sin(u1) * math.cos(u2) * cos_l)
        if sin_s == 0:
            return 0.0
        cos_s = math.sin(u1) * math.sin(u2) + math.cos(u1) * math.cos(u2) * cos_l
        sigma = math.atan2(sin_s, cos_s)
        sin_a = math.cos(u1) * math.cos(u2) * sin_l / sin_s
        cos2_a = 1 - sin_a**2
        cos_2sm = cos_s - 2 * math.sin(u1) * math.sin(u2) / cos2_a if cos2_a else 0.0
        c = f / 16 * cos2_a * (4 + f * (4 - 3 * cos2_a))
        previous = lam
        lam = big_l + (1 - c) * f * sin_a * (sigma + c * sin_s * (cos_2sm + c * cos_s * (-1 + 2 * cos_2sm**2)))
        if abs(lam - previous) < 1e-12:
            break
    u_sq = cos2_a * (a**2 - b**2) / b**2
    k_a = 1 + u_sq / 16384 * (4096 + u_sq * (-768 + u_sq * (320 - 175 * u_sq)))
    k_b = u_sq / 1024 * (256 + u_sq * (-128 + u_sq * (74 - 47 * u_sq)))
    d_sigma = k_b * sin_s * (cos_2sm + k_b / 4 * (cos_s * (-1 + 2 * cos_2sm**2)
              - k_b / 6 * cos_2sm * (-3 + 4 * sin_s**2) * (-3 + 4 * cos_2sm**2)))  # fmt: skip
    return b * k_a * (sigma - d_sigma) / 1000
