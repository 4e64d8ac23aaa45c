"""Copy-on-write over one base DB per worker, with an undo journal.

The official tools mutate pydantic records in place (`user.payment_methods[...].amount -= …`). Deep-copying the whole DB
per rollout costs 130–370 ms (docs/explanation/measured-facts.md), so each top-level collection of the DB (users,
orders, flights, …) is replaced by a `CowDict`: while a call that may write is running, the first access to a record
copies that record alone and journals the object it replaced. Undoing a journal entry puts the untouched object back, so
a rollout reset, a rejected call and a state-consistency walk-back all cost as much as the records that were touched.
Reads that iterate a collection see the current records without copying; the official tools only mutate records they
fetched by key (checked against every tool).

A record's own collections of records (a flight's `dates`, a user's `payment_methods`, a product's
`variants`) are copied the same way, one level down: copying a record copies its fields but wraps such a
dict in a new `CowDict` over the same entries, so booking a seat copies one flight date, not the flight's
whole calendar. The tools reach those entries by key too.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from pipeline.core.values import ATOMS

_MISSING = object()
_set = object.__setattr__  # pydantic records refuse attributes that are not fields


class Journal:
    """The undo log shared by every CowDict of one DB, and the current call's generation."""

    def __init__(self) -> None:
        self.entries: list[tuple[dict[Any, Any], Any, Any]] = []
        self.generation = 0
        self.tracking = False  # True while a call that may write runs

    def begin(self, tracking: bool) -> None:
        """Start a new call: records copied by earlier calls are copied again before being changed."""
        self.generation += 1
        self.tracking = tracking

    def record(self, container: dict[Any, Any], key: Any, old: Any) -> None:
        self.entries.append((container, key, old))

    def rollback(self, mark: int) -> None:
        entries = self.entries
        while len(entries) > mark:
            container, key, old = entries.pop()
            if old is _MISSING:
                dict.pop(container, key, None)
            else:
                dict.__setitem__(container, key, old)
            if isinstance(container, CowDict):
                container.owned.pop(key, None)


class CowDict(dict[Any, Any]):
    """A dict of records that copies a record on its first keyed access within a writing call."""

    __slots__ = ("journal", "owned")

    def __init__(self, items: dict[Any, Any], journal: Journal) -> None:
        super().__init__(items)
        self.journal = journal
        self.owned: dict[Any, int] = {}  # key -> generation whose call owns the current copy

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        journal = self.journal
        if not journal.tracking or self.owned.get(key) == journal.generation:
            return value
        fresh = copy_record(value, journal)
        journal.entries.append((self, key, value))
        dict.__setitem__(self, key, fresh)
        self.owned[key] = journal.generation
        return fresh

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if dict.__contains__(self, key) else default

    def __setitem__(self, key: Any, value: Any) -> None:
        self.journal.record(self, key, dict.get(self, key, _MISSING))
        dict.__setitem__(self, key, value)
        self.owned[key] = self.journal.generation

    def __delitem__(self, key: Any) -> None:
        self.journal.record(self, key, dict.__getitem__(self, key))
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        if not dict.__contains__(self, key):
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        self.__delitem__(key)
        return value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        # A copy is detached from the DB: a plain dict of copies, never a copy of the journal.
        return copy.deepcopy(dict(self), memo)

    def popitem(self) -> tuple[Any, Any]:
        raise TypeError("popitem is not journaled")

    def clear(self) -> None:
        raise TypeError("clear is not journaled")


def copy_record(value: Any, journal: Journal) -> Any:
    """A copy of a record that shares nothing mutable with it: a pydantic record's fields are copied one by
    one (nested records and lists likewise), its dicts of records becoming `CowDict`s over the same entries
    (copied when touched); a dict of plain values is copied as a dict; anything else is deep-copied. Several
    times faster than `copy.deepcopy`, which goes through pydantic's `__deepcopy__` for every nested record."""
    kind: type[object] = type(value)
    if kind in ATOMS:
        return value
    if kind is list:
        return [v if type(v) in ATOMS else copy_record(v, journal) for v in value]
    if kind is dict and _plain(value):
        return dict(value)  # what deepcopy makes of it: atoms are never copied
    if not isinstance(value, BaseModel) or value.__pydantic_extra__ or value.__pydantic_private__:
        return copy.deepcopy(value)
    source = value.__dict__
    if all(map(ATOMS.__contains__, map(type, source.values()))):
        fields = source.copy()  # most nested records: names, passengers, payments
    else:
        fields = {}
        for name, item in source.items():
            if type(item) in ATOMS:
                fields[name] = item
            elif isinstance(item, dict) and item and isinstance(next(iter(item.values())), BaseModel):
                fields[name] = CowDict(item, journal)  # records by key (a dict of plain values is copied below)
            else:
                fields[name] = copy_record(item, journal)
    # what pydantic's own __copy__ makes (a new instance over a copy of the field dict), without its generic steps
    fresh = kind.__new__(kind)
    _set(fresh, "__dict__", fields)
    _set(fresh, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    _set(fresh, "__pydantic_extra__", None if value.__pydantic_extra__ is None else {})
    _set(fresh, "__pydantic_private__", None if value.__pydantic_private__ is None else {})
    return fresh


def _plain(items: dict[Any, Any]) -> bool:
    """Whether every key and value of `items` is an atom (a str, number, bool or None: never copied)."""
    return all(map(ATOMS.__contains__, map(type, items))) and all(map(ATOMS.__contains__, map(type, items.values())))
