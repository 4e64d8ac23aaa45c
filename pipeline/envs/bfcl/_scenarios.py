"""Simulator instances in a task's initial state: a scenario is loaded once per (class, configuration) and
every rollout gets a copy of it.

BFCL builds an instance as `cls()` then `_load_scenario(copy of config, long_context=...)`, and every load
deep-copies the class's whole DEFAULT_STATE first. The environment needs one instance per involved class per
rollout, and the base, miss_func and miss_param tasks share their configurations (runs of several models
share all of them). So a loaded instance is pickled once and each rollout unpickles it: the object graph that
`copy.deepcopy` of a fresh load gives (both rebuild objects through `__reduce_ex__`, sharing kept).

That copy behaves as a fresh load only when a load depends on the configuration alone and shares nothing
mutable with the simulator module, which holds for both pinned releases without long_context. With it,
TravelAPI merges the module's extension cards and bookings into its state by reference, so that a booking
changes the module's record (as in BFCL itself) and a later load sees the change: a copy would not share
them. Long-context scenarios are therefore loaded afresh every time, as is a configuration that is not plain
JSON data (its JSON text could not stand for it exactly).

A configuration is kept under its JSON text and matches a later one that reads back from that text as an
equal value (JSON data: records are read from JSON or Arrow; a configuration holding one object in two places,
which such data cannot, would share it in a fresh load and not in a copy). Random generators seeded by the
load are restored from their state (as deepcopy does: a generator, then `setstate`) rather than unpickled:
their 625-word state is most of a pickle's size. The kept knowledge text is the loaded instance's, so the
address that `str` gives a generator in it is that instance's generator's, not the copy's (an address that
differs between any two loads anyway).
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.core.errors import InvalidRecord

KEPT = 1024  # loaded scenarios kept per release (most recently used first); a few KiB each


@dataclass(frozen=True, slots=True)
class Scenario:
    """One class's initial state for one configuration."""

    cls: type[object]
    config: Any  # the configuration loaded afresh (None when pickled: its key is its JSON text)
    long_context: bool
    stateless: bool  # no scenario to load: the instance is `cls()`
    pickled: bytes | None = None  # the loaded instance's attributes, generators apart; None: load afresh each time
    generators: tuple[tuple[str, Any], ...] = ()  # attribute -> state of its random generator
    text: str | None = None  # `knowledge_text` of the loaded instance (when pickled)

    def instance(self) -> Any:
        if self.pickled is None:
            return load(self.cls, self.config, self.long_context, self.stateless)
        instance = self.cls.__new__(self.cls)
        attributes = pickle.loads(self.pickled)
        for name, state in self.generators:
            generator = random.Random.__new__(random.Random)
            generator.setstate(state)
            attributes[name] = generator  # an existing key: the attributes keep their order
        instance.__dict__.update(attributes)
        return instance

    def knowledge(self, instance: Any) -> str | None:
        """The text of `instance`, which is this scenario's initial state."""
        return self.text if self.pickled is not None else knowledge_text(instance)


class Scenarios:
    """The scenarios of one release, the `KEPT` most recently used kept."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._scenarios: OrderedDict[tuple[Any, ...], Scenario] = OrderedDict()

    def start(self, cls: type, config: Any, long_context: bool, stateless: bool) -> tuple[Scenario, Any]:
        """The scenario of `config` and an instance in its initial state: a copy of the kept one, or the
        instance just loaded (and kept) for it."""
        if stateless:
            key: tuple[Any, ...] = (cls,)
        elif long_context:
            return _afresh(cls, config, long_context, stateless)
        else:
            try:
                key = (cls, orjson.dumps(config, option=orjson.OPT_PASSTHROUGH_SUBCLASS))
            except orjson.JSONEncodeError:  # not plain JSON data (a subclass, non-text keys, a huge int)
                return _afresh(cls, config, long_context, stateless)
        scenario = self._scenarios.get(key)
        # Equal text, equal values: the same configuration (NaN is written null, a tuple as an array).
        if not stateless and orjson.loads(key[1]) != config:
            return _afresh(cls, config, long_context, stateless)
        if scenario is not None:
            self._scenarios.move_to_end(key)
            return scenario, scenario.instance()
        instance = load(cls, config, long_context, stateless)
        scenario = _kept(instance, long_context, stateless)
        if scenario is None:
            return Scenario(cls, config, long_context, stateless), instance
        self._scenarios[key] = scenario
        if len(self._scenarios) > self._kept:
            self._scenarios.popitem(last=False)
        return scenario, instance


def _afresh(cls: type, config: Any, long_context: bool, stateless: bool) -> tuple[Scenario, Any]:
    scenario = Scenario(cls, config, long_context, stateless)
    return scenario, scenario.instance()


class _Shared(Exception):
    pass


def _refuse(generator: random.Random) -> Any:
    raise _Shared


def _kept(instance: Any, long_context: bool, stateless: bool) -> Scenario | None:
    """The scenario of a just loaded instance, pickled; None if the instance does not pickle."""
    attributes = dict(vars(instance))
    generators = tuple((k, v.getstate()) for k, v in attributes.items() if type(v) is random.Random)
    for name, _ in generators:
        attributes[name] = None
    try:
        pickled = _pickled(attributes)
    except Exception:  # whatever does not pickle (or a generator held twice): loaded afresh, as BFCL does
        return None
    text = knowledge_text(instance)
    return Scenario(type(instance), None, long_context, stateless, pickled, generators, text)


def _pickled(attributes: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {random.Random: _refuse}  # a generator held elsewhere too: copies would not share it
    pickler.dump(attributes)
    return out.getvalue()


def load(cls: type, config: Any, long_context: bool, stateless: bool) -> Any:
    """An instance loaded as BFCL loads one."""
    instance = cls()
    if not stateless:
        try:
            instance._load_scenario(deep_copy(config), long_context=long_context)
        except Exception as exc:  # a malformed scenario in the record, not a simulator fault
            raise InvalidRecord(f"bfcl: {cls.__name__} cannot load the task's initial_config: {exc!r}") from exc
    return instance


def knowledge_text(instance: Any) -> str | None:
    """An instance's attributes as JSON text (what `BfclEnvironment.knowledge` declares); None if it has none."""
    attributes = vars(instance)
    return json.dumps(attributes, default=str, ensure_ascii=False) if attributes else None


class _NotPlain(Exception):
    pass


def _plain_copy(value: Any, memo: dict[int, Any]) -> Any:
    """A copy of plain JSON data (dicts with text keys, lists, text, numbers, booleans, None); _NotPlain for
    anything else. For such data it equals `copy.deepcopy` (shared parts stay shared through `memo`; a cycle
    raises RecursionError), about twice as fast. Exact types only: a subclass may copy differently."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is not dict and kind is not list:
        raise _NotPlain
    if id(value) in memo:
        return memo[id(value)]
    if kind is list:
        out: Any = [_plain_copy(v, memo) for v in value]
    else:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            out[key] = _plain_copy(item, memo)
    memo[id(value)] = out
    return out


def deep_copy(value: Any) -> Any:
    """`copy.deepcopy(value)`, fast for plain JSON data (arguments, scenario configurations)."""
    try:
        return _plain_copy(value, {})
    except (_NotPlain, RecursionError):
        return copy.deepcopy(value)
