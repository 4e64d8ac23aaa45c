"""Integrations: pexec where users already work. `pexec publish` puts a run's verdicts back on the traces they
were read from (MLflow assessments, Phoenix span annotations), each store through its own client, which an
optional extra installs (`pexec[mlflow]`, `pexec[phoenix]`). inspect.py is an Inspect AI scorer (`executability`)
and its metrics (`ter`, `auc_pec`): a sample's tool calls replayed as `pexec ingest inspect` + `pexec score`
would replay them (`pexec[inspect]`).

Imports: core, storage, envs, replay, ingest, metrics.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "inspect",
    "mlflow",
    "phoenix",
    "verdicts",
]
