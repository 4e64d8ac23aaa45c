"""Stores with known truth, for tests, the demo and benchmarks.

rollouts.py      `pexec synth`: rollouts of a spec with injected failures and recoveries
support_logs.py  a production-style sample: OpenAI chat logs of a customer-support agent
telecom.py       `pexec synth tau_telecom`: official τ telecom tasks, both actors, on the official environment
banking.py       `pexec synth tau_banking_knowledge`: a τ source's banking_knowledge tasks, on its own code

Imports: core, envs.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "banking",
    "rollouts",
    "support_eval",
    "support_logs",
    "support_spans",
    "telecom",
]
