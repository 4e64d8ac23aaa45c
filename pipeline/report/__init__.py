"""`pexec report`: a scored run turned into the analysis an evaluation team would publish.

build_report (_build.py) computes (DuckDB: sql/report_*.sql, sql/paired_*.sql, and pipeline.metrics.cohorts's
metrics), ranks (_ranking.py), draws (_figures.py) and writes, under OUT (a local folder or an fsspec URL, like the
run):
  report.md, report.html                 the tables and figures (HTML self-contained)
  tables/<name>.csv, tables/<name>.parquet   the numbers behind every table
  figures/<name>.png, .pdf, .svg, .csv   each figure (300 dpi PNG, vector PDF/SVG) and the data it draws

Imports: core, storage, metrics.
"""

from __future__ import annotations

from pipeline.core.errors import ReportError
from pipeline.report._build import ReportResult, build_report, check_output, check_request
from pipeline.report.paired import Compare, parse_compare

__all__ = [
    "Compare",
    "ReportError",
    "ReportResult",
    "build_report",
    "check_output",
    "check_request",
    "parse_compare",
]
