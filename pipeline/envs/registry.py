"""Environment registry: built-in environments, declarative specs, and third-party entry points.

Resolution of a name (a rollout's `benchmark`, or `--env`): a registered factory first, then a package's
entry point in the `pexec.environments` group, then a spec folder of that name (the declarative spec
environment). Instances are cached per process: a Ray worker builds each environment once.

The built-in families register themselves with `@register` when they are imported, which
pipeline/envs/__init__.py does: importing anything under `pipeline.envs` runs it first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from pipeline.envs.base import EnvError, Environment
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.envs.spec.loader import find_spec, spec_folders

ENTRY_POINT_GROUP = "pexec.environments"


@dataclass(frozen=True)
class EnvOptions:
    """Settings that select and configure an environment; hashable so instances can be cached."""

    spec_dirs: tuple[str, ...] = field(default_factory=tuple)  # extra folders searched for specs
    spec: str | None = None  # a spec name or folder that gives `observed` its schemas
    policy: str = "code"  # code | strict (written-policy overlays, where an environment has them)


Factory = Callable[[EnvOptions], Environment]
_FACTORIES: dict[str, Factory] = {}
_INSTANCES: dict[tuple[str, EnvOptions], Environment] = {}
_UNKNOWN: dict[tuple[str, EnvOptions], EnvError] = {}


def register(name: str) -> Callable[[Factory], Factory]:
    """Register an environment factory under `name` (decorator)."""

    def wrap(factory: Factory) -> Factory:
        _FACTORIES[name] = factory
        return factory

    return wrap


def _factory(name: str, options: EnvOptions) -> Factory:
    if name in _FACTORIES:
        return _FACTORIES[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    path = find_spec(name, options.spec_dirs)
    if path is None:
        known = sorted(_FACTORIES) + sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise EnvError(f"unknown environment {name!r}: not registered ({', '.join(known)}) and no spec of that name")
    return lambda opts: SpecEnvironment.from_folder(path)


def get_environment(name: str, options: EnvOptions | None = None) -> Environment:
    """The (cached) environment instance for `name`.

    A name that cannot be resolved is remembered too: a store with many records of an unknown benchmark
    must not search entry points and spec folders again for each of them.
    """
    options = options or EnvOptions()
    key = (name, options)
    if key in _UNKNOWN:
        raise _UNKNOWN[key]
    if key not in _INSTANCES:
        try:
            _INSTANCES[key] = _factory(name, options)(options)
        except EnvError as exc:
            _UNKNOWN[key] = exc
            raise
    return _INSTANCES[key]


def new_environment(name: str, options: EnvOptions | None = None) -> Environment:
    """An instance of `name` of its own, not cached: two states of one instance need not coexist (the spec
    and τ environments reuse one state per instance), so every live guard session holds its own."""
    options = options or EnvOptions()
    return _factory(name, options)(options)


def forget_unresolved() -> None:
    """Drop the memory of names that did not resolve: a new scoring run looks again (a simulator may have
    been installed, a spec added since)."""
    _UNKNOWN.clear()


def list_environments(options: EnvOptions | None = None) -> dict[str, str]:
    """Every name `get_environment` resolves, with where it comes from (in resolution order: a registered
    environment shadows an entry point, which shadows a spec folder)."""
    options = options or EnvOptions()
    found = {name: f"spec {folder}" for name, folder in spec_folders(options.spec_dirs).items()}
    found.update({ep.name: f"entry point {ep.value}" for ep in entry_points(group=ENTRY_POINT_GROUP)})
    found.update({name: "built-in" for name in _FACTORIES})
    return dict(sorted(found.items()))
