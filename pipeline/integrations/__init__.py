"""Integrations: pexec where users already work. `pexec publish` puts a run's verdicts back on the traces they
were read from (MLflow assessments, Phoenix span annotations), each store through its own client, which an
optional extra installs (`pexec[mlflow]`, `pexec[phoenix]`).

Imports: core, storage, ingest, metrics.
"""
