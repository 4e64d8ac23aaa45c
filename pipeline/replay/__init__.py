"""Replay: one rollout's calls, in order, against an environment, and the S/D/P verdict of every call with the
cause of the first error. Independent of any benchmark: it talks to the environment protocol only, and the
batch scorer and the live guard call the same code.

checker.py       the replay loop, the three checks, cause labels
dependencies.py  check D: explicit references to earlier outputs and grounded values

Imports: core, envs.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "checker",
    "dependencies",
]
