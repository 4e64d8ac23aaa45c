"""Stores with known truth, for tests, the demo and benchmarks.

rollouts.py      `pexec synth`: rollouts of a spec with injected failures and recoveries
support_logs.py  a production-style sample: OpenAI chat logs of a customer-support agent

Imports: core, envs.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "rollouts",
    "support_eval",
    "support_logs",
    "support_spans",
]
