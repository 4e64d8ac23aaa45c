"""pyarrow as pexec's modules import it (`from pipeline.core.arrow import pa`), and its pandas probe.

The first time pyarrow converts Python values (`pa.array`, `Table.from_pylist`...) it checks whether they are
pandas objects, importing pandas to find out: about 0.3 s of CPU in every process that writes a table, each
`pexec` command and each Ray worker, for a library pexec never hands to pyarrow. pexec's own processes answer the
probe once with pandas hidden from that one call: the command line (pipeline.apps.cli), and the Ray workers it starts,
which inherit PEXEC_PANDAS_PROBE from it and answer when they first import this module. A program that imports
pipeline as a library is left alone: there pyarrow may well be handed pandas objects, which it then has to see.
pandas stays importable everywhere, and a `to_pandas()` still makes pyarrow import it for real.
"""

from __future__ import annotations

import os
import sys
import threading
from importlib.machinery import ModuleSpec

import pyarrow as pa

__all__ = ["answer_pandas_probe", "pa"]

PROBE_ENV = "PEXEC_PANDAS_PROBE"


class _PandasHidden:
    """A meta-path finder that makes `import pandas` fail in one thread (the one answering the probe)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name == "pandas" and threading.get_ident() == self.thread:
            raise ImportError("hidden while pyarrow's pandas probe is answered")
        return None


def _answer() -> None:
    if "pandas" in sys.modules:  # already paid for: the probe finds it
        return
    hidden = _PandasHidden()
    sys.meta_path.insert(0, hidden)
    try:
        pa.array([0])  # a Python list: pyarrow's first conversion, where it probes
    finally:
        sys.meta_path.remove(hidden)


def answer_pandas_probe() -> None:
    """For this process and the processes it starts (a local Ray's workers): pexec's command line only."""
    os.environ[PROBE_ENV] = "answered"
    _answer()


if os.environ.get(PROBE_ENV) == "answered":
    _answer()
