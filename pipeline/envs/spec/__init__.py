"""The declarative spec family: an environment written as data in a `specs/<name>/` folder.

`loader.py` finds, reads and validates a spec folder (schemas, grounded parameters, preconditions,
effects, outputs, initial state); `env.py` replays it over a journaled JSON document. The family is not
registered under fixed names: the registry (pipeline/envs/_registry.py) falls back to a spec folder when a
name matches no registered environment and no entry point.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "env",
    "loader",
]
