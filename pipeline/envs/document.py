"""A JSON document with an undo journal: the state of the spec and ToolSandbox environments.

Every change is journaled, so an environment returns to an earlier mark (after a failed effect, for the
state-consistency re-test, at the spec environment's next rollout) by undoing the changes made since,
instead of copying the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.expr import EvalError

_MISSING = object()


@dataclass
class JournaledDoc:
    """A JSON document and the undo journal of every change made to it."""

    doc: dict[str, Any]
    journal: list[tuple[str, Any, Any, Any]] = field(default_factory=list)

    def set(self, container: Any, key: Any, value: Any) -> None:
        if isinstance(container, list):
            if key == len(container):
                self.journal.append(("ins", container, key, None))
                container.append(value)
                return
            old = container[key]  # raises IndexError for a hole
        elif isinstance(container, dict):
            old = container.get(key, _MISSING)
        else:
            raise EvalError(f"cannot set {key!r} on a {type(container).__name__}")
        self.journal.append(("set", container, key, old))
        container[key] = value

    def delete(self, container: Any, key: Any) -> None:
        try:
            old = container[key]
        except (KeyError, IndexError, TypeError) as exc:
            raise EvalError(f"cannot delete {key!r}: not present") from exc
        self.journal.append(("del", container, key, old))
        del container[key]

    def rollback(self, mark: int) -> None:
        journal = self.journal
        while len(journal) > mark:
            op, container, key, old = journal.pop()
            if op == "ins":
                del container[key]
            elif op == "del":
                if isinstance(container, list):
                    container.insert(key, old)
                else:
                    container[key] = old
            elif old is _MISSING:
                del container[key]
            else:
                container[key] = old
