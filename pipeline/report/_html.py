"""The report as one self-contained HTML file: inline CSS, figures as data: URIs (SVG shown, PNG as the
fallback), every text escaped (labels come from logs)."""

from __future__ import annotations

import base64
from html import escape

from pipeline.report._figures import Chart
from pipeline.report.layout import Table

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
div.scroll { overflow-x: auto; max-width: 100%; margin: .5em 0; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.key, th.key { text-align: left; }
div.scroll table { border-collapse: separate; border-spacing: 0; }
div.scroll th, div.scroll td { border-width: 0 1px 1px 0; }
div.scroll thead th { border-top-width: 1px; }
div.scroll tr > :first-child { position: sticky; left: 0; z-index: 1; background: #fff; border-left-width: 1px; }
div.scroll thead tr > :first-child { background: #f3f3f3; }
p.note { color: #555; margin: .2em 0; font-size: .92em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: .92em; }
"""


def render(title: str, preamble: list[str], tables: list[Table], charts: list[Chart], n_keys: list[int]) -> str:
    """`n_keys[i]`: how many leading columns of tables[i] are labels (left-aligned)."""
    body = [f"<h1>{escape(title)}</h1>", *(f"<p>{escape(p)}</p>" for p in preamble)]
    for t, keys in zip(tables, n_keys, strict=True):
        body += [f"<h2>{escape(t.title)}</h2>", _table(t, keys)]
        body += [f'<p class="note">{escape(n)}</p>' for n in t.notes]
    if charts:
        body.append("<h2>Figures</h2>")
        body += [_figure(c) for c in charts]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _table(t: Table, keys: int) -> str:
    def cls(i: int) -> str:
        return ' class="key"' if i < keys else ""

    head = "".join(f"<th{cls(i)}>{escape(c)}</th>" for i, c in enumerate(t.columns))
    rows = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{escape(c)}</td>" for i, c in enumerate(row)) + "</tr>\n" for row in t.rows
    )
    # Wide tables scroll inside their container (first column pinned), never the page.
    return f'<div class="scroll">\n<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}</tbody>\n</table>\n</div>'


def _figure(c: Chart) -> str:
    png = base64.b64encode(c.png).decode()
    svg = base64.b64encode(c.svg.encode()).decode()
    # The browser shows the SVG; the PNG is the fallback (and what the Markdown report links to).
    return (
        f'<figure id="{escape(c.name)}">\n<picture>\n'
        f'<source type="image/svg+xml" srcset="data:image/svg+xml;base64,{svg}">\n'
        f'<img alt="{escape(c.title)}" src="data:image/png;base64,{png}">\n</picture>\n'
        f"<figcaption>{escape(c.title)}</figcaption>\n</figure>"
    )
