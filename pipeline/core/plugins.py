"""The one plug-in pattern of pexec, shared by every kind of plug-in (log formats, environments): a class that
states every method of the kind (`pipeline.ingest.base.LogFormat`, `pipeline.envs.base.Environment`), a `Registry`
of the kind's plug-ins, and an entry-point group through which an installed package adds one.

A registry resolves a name, in this order, to:
1. a plug-in registered in this process (`Registry.register`: tests, notebooks);
2. a built-in, declared by name as `"module:attribute"` and imported on first use, so that listing the names, or
   an unknown name's error, imports no plug-in module (a Ray worker's first import stays light);
3. an entry point of the kind's group, loaded the same guarded way for every kind: whatever the package's import
   raises becomes the kind's one-line error naming the package, its version and the entry point, and the object
   loaded must be of the kind, under that name.

A name's outcome is remembered, a failure or an unknown name too, until `forget`: a store with many records of an
unknown benchmark must not search the entry points again for each of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar, cast

from pipeline.core.errors import PexecError

T = TypeVar("T")

BUILT_IN = "built-in"
REGISTERED = "registered"


class Registry(Generic[T]):
    """The plug-ins of one kind, by name.

    `noun` names the kind in messages ("log format"), `group` is its entry-point group, `error` the kind's error
    class (every refusal is one), `accepts(obj, name)` whether a loaded object is a plug-in of the kind named
    `name`, and `expected` what it accepts, for the refusal (`{name}` is filled in). `built_in` maps each built-in
    name to the `"module:attribute"` that holds it, in the order the kind asks them (sniffing a log's format asks
    the built-in formats in this order).
    """

    def __init__(
        self,
        noun: str,
        group: str,
        error: type[PexecError],
        accepts: Callable[[Any, str], bool],
        expected: str,
        built_in: Mapping[str, str],
    ) -> None:
        self.noun = noun
        self.group = group
        self._error = error
        self._accepts = accepts
        self._expected = expected
        self._built_in = dict(built_in)
        self._registered: dict[str, T] = {}
        self._found: dict[str, T | PexecError | None] = {}  # name -> the plug-in, why it cannot be loaded, or no such
        self._all_entry_points: dict[str, EntryPoint] | None = None  # the group as last read
        self._entry_points: dict[str, EntryPoint] | None = None  # those that no other plug-in shadows

    def register(self, name: str, plugin: T) -> None:
        """Add `plugin` under `name` in this process; it shadows a built-in or an entry point of that name."""
        self._registered[name] = plugin
        self._found.pop(name, None)
        self._entry_points = None

    def entry_points(self) -> dict[str, EntryPoint]:
        """The group's entry points by name that no built-in or registered plug-in shadows, read once (until
        `forget`); of two packages' entry points of one name, the first found wins."""
        if self._all_entry_points is None:
            found: dict[str, EntryPoint] = {}
            for ep in sorted(entry_points(group=self.group), key=lambda ep: ep.name):
                found.setdefault(ep.name, ep)
            self._all_entry_points = found
        if self._entry_points is None:
            shadowed = self._built_in.keys() | self._registered.keys()
            self._entry_points = {n: ep for n, ep in self._all_entry_points.items() if n not in shadowed}
        return self._entry_points

    def sources(self) -> dict[str, str]:
        """Every name with where it comes from, in resolution order: the built-ins as declared (`built-in`, or
        `registered` when this process replaced one), the names registered in this process, then the entry points
        by name (`entry point module:attribute`)."""
        found = {name: BUILT_IN for name in self._built_in}
        found.update({name: REGISTERED for name in self._registered})
        found.update({name: f"entry point {ep.value}" for name, ep in self.entry_points().items()})
        return found

    def names(self) -> list[str]:
        """Every name, in resolution order (see `sources`)."""
        return list(self.sources())

    def find(self, name: str) -> T | None:
        """The plug-in `name`, or None when nothing of this kind has that name; an entry point that cannot be loaded,
        or loads something that is not of this kind, is the kind's error."""
        if name not in self._found:
            try:
                self._found[name] = self._load(name)
            except PexecError as exc:
                self._found[name] = exc
        found = self._found[name]
        if isinstance(found, PexecError):
            raise found.with_traceback(None)  # raised again per record: its traceback must not grow each time
        return found

    def refusal(self, name: str, what: str) -> PexecError:
        """The kind's error about plug-in `name`, naming where it comes from: `<noun> 'name': <origin> <what>`."""
        return self._error(f"{self.noun} {name!r}: {self._origin(name)} {what}")

    def forget(self) -> None:
        """Drop the memory of names that did not resolve, and read the entry points again: a package may have been
        installed since."""
        self._found = {name: found for name, found in self._found.items() if not isinstance(found, PexecError | None)}
        self._all_entry_points = self._entry_points = None

    def _load(self, name: str) -> T | None:
        if name in self._registered:
            return self._registered[name]
        if name in self._built_in:
            # pexec's own module: an import that fails here is a bug of pexec, and keeps its traceback
            loaded = EntryPoint(name, self._built_in[name], self.group).load()
        else:
            ep = self.entry_points().get(name)
            if ep is None:
                return None
            try:
                loaded = ep.load()
            except Exception as exc:  # whatever the package's import raises: the user needs its name, not a traceback
                raise self.refusal(name, f"fails: {_one_line(exc)}") from exc
        if not self._accepts(loaded, name):
            raise self.refusal(name, f"is not {self._expected.format(name=repr(name))}")
        # `accepts` has just checked that the object is of this kind, which the checker cannot see
        return cast(T, loaded)

    def _origin(self, name: str) -> str:
        if name in self._registered:
            return "the plug-in registered in this process"
        if name in self._built_in:
            return f"the built-in {self._built_in[name]}"
        ep = self.entry_points().get(name)
        if ep is None:
            return "nothing"
        package = f"package {ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unnamed package"
        return f"the entry point {ep.value} of {package}"


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type, then its message with every run of whitespace made one space."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def declared(cls: type) -> tuple[str, ...]:
    """The public attributes and methods a plug-in class states (its annotations, properties and functions), in the
    order it declares them: what every plug-in of the kind must have."""
    members = [name for name in vars(cls).get("__annotations__", {}) if not name.startswith("_")]
    for name, value in vars(cls).items():
        if not name.startswith("_") and name not in members and (isinstance(value, property) or callable(value)):
            members.append(name)
    return tuple(members)
