"""Where users' evals and traces already live: pexec's verdicts computed from inside another tool.

inspect.py   an Inspect AI scorer (`executability`) and its metrics (`ter`, `auc_pec`): a sample's tool calls
             replayed as `pexec ingest inspect` + `pexec score` would replay them

Each module imports its tool's package (an optional dependency) itself; importing this room imports none.

Imports: core, envs, replay, ingest.
"""
