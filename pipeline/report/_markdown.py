"""The report as Markdown (report.md): the layout's tables as pipe tables, figures linked from figures/."""

from __future__ import annotations

from pipeline.report._figures import Chart
from pipeline.report.layout import Table


def render(title: str, preamble: list[str], tables: list[Table], charts: list[Chart]) -> str:
    parts = [f"# {_cell(title)}", "", *preamble, ""]
    for t in tables:
        parts += [f"## {_cell(t.title)}", "", _table(t), ""]
        parts += [f"{_cell(n)}  " for n in t.notes]
        parts.append("")
    if charts:
        parts += ["## Figures", ""]
        parts += [f"![{_cell(c.title)}](figures/{c.name}.png)" for c in charts]
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def _table(t: Table) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in t.columns) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def _cell(text: str) -> str:
    # Labels come from logs: keep them on one line and from breaking the table or adding markup.
    out = " ".join(str(text).split())
    for ch in "\\|*_`[]<>#":
        out = out.replace(ch, "\\" + ch)
    return out
