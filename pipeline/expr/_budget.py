"""What an expression may spend: the limits checked when it is compiled (syntax nodes, nested comprehension
clauses), and the `Budget` every evaluation runs under, metered per thread — `metered()` makes a block
(e.g. one tool call) share one. The errors of evaluation: `EvalError`, and `BudgetExceeded` when the
budget runs out."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


class EvalError(Exception):
    """An expression failed at evaluation time (missing key, type error, division by zero, ...)."""


class BudgetExceeded(EvalError):
    """An evaluation went over its budget. Unlike other evaluation errors it says something about the
    expression, not about missing data, so rules never skip it: it fails the call."""


@dataclass(frozen=True)
class Budget:
    """What one evaluation (or one `metered()` block, e.g. a whole tool call) may spend."""

    steps: int = 1_000_000  # syntax nodes evaluated per comprehension item, plus scans done in C
    size: int = 10_000_000  # characters and elements built (concatenations, slices, function results)
    int_bits: int = 4096  # the largest integer a product may make
    seconds: float = 10.0  # backstop only: the deterministic limits above stop any evaluation within ~1 s idle


BUDGET = Budget()
MAX_NODES = 2000  # syntax nodes of one expression
MAX_LOOPS = 3  # comprehension clauses nested in one another
_CLOCK_EVERY = 10_000  # steps between two looks at the clock


class _Meter:
    __slots__ = ("budget", "clock", "deadline", "size", "steps")

    def __init__(self, budget: Budget) -> None:
        self.budget, self.steps, self.size = budget, budget.steps, budget.size
        self.deadline, self.clock = time.monotonic() + budget.seconds, _CLOCK_EVERY

    def step(self, n: int) -> None:
        self.steps -= n
        if self.steps < 0:
            raise BudgetExceeded(f"evaluation budget exceeded: more than {self.budget.steps:,} steps")
        self.clock -= n
        if self.clock <= 0:
            self.clock = _CLOCK_EVERY
            if time.monotonic() > self.deadline:
                raise BudgetExceeded(f"evaluation budget exceeded: more than {self.budget.seconds:g} s")

    def build(self, n: int) -> None:
        self.size -= n
        if self.size < 0:
            raise BudgetExceeded(
                f"evaluation budget exceeded: builds more than {self.budget.size:,} characters or elements"
            )


class _Active(threading.local):
    # None outside any evaluation; _PENDING inside one that has not charged anything yet (most rules never
    # do, and they should not pay for a meter)
    meter: _Meter | object | None = None


_active = _Active()
_PENDING = object()


def _meter() -> _Meter:
    meter = _active.meter
    if type(meter) is _Meter:
        return meter
    if meter is None:  # closures only run inside Expr.__call__
        raise RuntimeError("expression closure evaluated outside Expr.__call__")
    meter = _active.meter = _Meter(BUDGET)
    return meter


class metered:  # lower case: used like a function, `with metered():`
    """Every expression evaluated inside the block shares one budget (e.g. all rules of one tool call).

    A class rather than a generator: it runs around every simulated call."""

    __slots__ = ("outermost",)

    def __enter__(self) -> None:
        self.outermost = _active.meter is None
        if self.outermost:
            _active.meter = _PENDING

    def __exit__(self, *exc: object) -> None:
        if self.outermost:
            _active.meter = None
