"""docs/notebooks/tour.ipynb runs clean, top to bottom, in a fresh kernel of this environment (nbclient): it makes
its own small run, reads its tables and metrics through `open_run`, draws the PEC figure, finds the rollouts
behind a TER and is refused an incomplete run. Its outputs say what the tour promises."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

# A page of the docs, run in a Jupyter kernel: a process of its own that listens on loopback ports.
pytestmark = [pytest.mark.docs, pytest.mark.server]
NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebooks" / "tour.ipynb"


def test_the_tour_notebook_runs_clean(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"]
    text = "".join(o.get("text", "") for o in outputs) + "".join(
        o.get("data", {}).get("text/plain", "") for o in outputs if "data" in o
    )
    assert "partial read: None" in text and "400 rollouts" in text
    assert "'ter_lo'" in text and "'bootstrap_B': 200" in text
    assert "rollouts with an invalid prefix" in text and "'failed_check'" in text
    assert "refused:" in text and "partial read covers: {" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the PEC figure
    assert not list(tmp_path.iterdir())  # the demo run went to a temporary folder, and is gone
