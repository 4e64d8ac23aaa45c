"""pyarrow's pandas probe (pipeline.core.arrow): answered in pexec's own processes, so a command that writes
tables never imports pandas, and left alone where pipeline is a library, so pandas objects keep their meaning."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

# Converts Python values as every writer does, then reports whether pandas was imported, and what pyarrow makes of
# a pandas Series with a missing value (a null if pyarrow sees a Series, NaN if it takes it for a plain sequence).
PROBE = """
import sys
{setup}
from pipeline.core.arrow import pa
pa.array(["a", None])
imported = "pandas" in sys.modules
import pandas as pd
print(imported, pa.array(pd.Series([1.5, None])).null_count, type(pa.table({{"a": [1]}}).to_pandas()).__name__)
"""


def run(setup: str, env: dict[str, str] | None = None) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "PEXEC_PANDAS_PROBE"} | (env or {})
    done = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()


def test_the_command_line_and_what_it_starts_convert_without_importing_pandas() -> None:
    # The command line answers the probe and marks the environment, which the Ray workers it starts inherit.
    cli = run("import pipeline.apps.cli, os; assert os.environ['PEXEC_PANDAS_PROBE'] == 'answered'")
    assert cli[0] == "False"
    assert cli[2] == "DataFrame"  # pandas is still there when pyarrow really needs it
    worker = run("", {"PEXEC_PANDAS_PROBE": "answered"})
    assert worker[0] == "False"


def test_a_library_process_keeps_pyarrows_own_view_of_pandas() -> None:
    assert run("") == ["True", "1", "DataFrame"]
