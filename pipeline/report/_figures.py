"""The report's figures: what each shows is computed by a pure function (its rows are also written as CSV and
tested); drawing is matplotlib (Agg), saved as PNG (300 dpi), PDF and SVG (text kept as text) with fixed
metadata, so reruns give the same files and a paper can take them as they are.

Labels come from data: drawn as text (never mathtext), with control characters as escapes (pipeline.core.text).
Colours mean the same thing everywhere: a cause always has its own colour (CAUSE_COLOURS, keyed by name),
and a cohort takes the colour of its place in the report's sorted cohort labels (cohort_colours), in every
figure. One title per panel (the benchmark); the figure's title is its caption, outside the image.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from pipeline.core.model import CAUSES
from pipeline.core.text import literal
from pipeline.metrics.results import Cohort, ToolProfile
from pipeline.report._tables import CauseShare, FedShare

EXECUTABLE = "executable"  # the FED bin of fully executable rollouts (FED = T + 1)
MAX_OVERLAID = 8  # cohorts drawn on one axes; more get one small panel each

# Okabe & Ito's colour-blind-safe set, in the order cohorts take them (black and yellow last).
COHORT_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
# Paul Tol's muted set, one colour per cause for good; a label outside the fixed causes is grey.
CAUSE_COLOURS = {
    "schema": "#332288",
    "dependency": "#88CCEE",
    "information": "#117733",
    "state_consistency": "#DDCC77",
    "precondition": "#CC6677",
}
OTHER_CAUSE = "#BBBBBB"

_STYLE = {
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs on every machine
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text (searchable, editable)
    "svg.hashsalt": "pexec",  # stable element ids
    "pdf.fonttype": 42,  # TrueType, text kept
    "text.parse_math": False,  # labels come from data: `$...$` in a model name is text, never mathtext
}
_Sink = TypeVar("_Sink", io.BytesIO, io.StringIO)
_PANEL = (3.6, 2.7)  # inches per panel
_LABEL_WIDTH = 28  # characters per line of a cohort label in a legend or under a bar; longer parts are wrapped


@dataclass(frozen=True)
class Chart:
    """A drawn figure and the rows it draws. Its file forms are rendered when first asked for, in one fixed order
    (SVG, PNG, PDF: each drawing lays the figure out again from where the last one left it, so the order decides
    the bytes), in the figures' style, and kept: a caller that needs the SVG alone pays for that one (a 300 dpi PNG
    costs about twice what the SVG does)."""

    name: str  # file stem under figures/
    title: str  # the caption
    columns: list[str]
    rows: list[list[Any]]  # the data drawn, one row per point / bar segment
    figure: Figure = field(repr=False, compare=False)

    @cached_property
    def svg(self) -> str:
        return self._saved(io.StringIO(), format="svg", metadata={"Date": None, "Creator": None}).getvalue()

    @cached_property
    def png(self) -> bytes:
        self.svg  # noqa: B018 - rendered in order
        return self._saved(io.BytesIO(), format="png", dpi=300, metadata={"Software": None}).getvalue()

    @cached_property
    def pdf(self) -> bytes:
        self.png  # noqa: B018 - rendered in order
        metadata = {"CreationDate": None, "Creator": None, "Producer": None}
        return self._saved(io.BytesIO(), format="pdf", metadata=metadata).getvalue()

    def _saved(self, sink: _Sink, **how: Any) -> _Sink:
        with plt.rc_context(_STYLE):  # saved in the style it was drawn in: text kept as text, stable SVG ids
            self.figure.savefig(sink, **how)
        return sink


def cohort_colours(labels: Iterable[str]) -> dict[str, str]:
    """Cohort label -> colour, by sorted label (the palette repeats past eight; small multiples tell apart)."""
    return {lab: COHORT_PALETTE[i % len(COHORT_PALETTE)] for i, lab in enumerate(sorted(set(labels)))}


def cause_colour(cause: str) -> str:
    return CAUSE_COLOURS.get(cause, OTHER_CAUSE)


Label = Callable[[Mapping[str, object]], str]  # a row's cohort as the figures name it
Handle = Artist | BarContainer  # what a legend entry shows: a line, or a group of bars


def pec_rows(cohorts: list[Cohort], label: Label) -> list[list[Any]]:
    """[benchmark, condition, k, PEC(k), lo, hi] for every cohort and k."""
    return [[c["benchmark"], label(c), p["k"], p["value"], p["lo"], p["hi"]] for c in cohorts for p in c["pec"]]


def fed_rows(fed: list[FedShare], label: Label) -> list[list[Any]]:
    """[benchmark, condition, bin, n, share]; bins are the depths 1, 2, … then `executable`."""
    ordered = sorted(fed, key=lambda r: (r["benchmark"], label(r), r["executable"], r["fed"] or 0))
    return [
        [r["benchmark"], label(r), EXECUTABLE if r["executable"] else str(r["fed"]), r["n"], r["share"]]
        for r in ordered
    ]


def cause_rows(causes: list[CauseShare], label: Label) -> list[list[Any]]:
    """[benchmark, condition, cause, n, share] in the fixed cause order (docs/explanation/causes.md), unknown labels
    last."""
    rank: dict[str, int] = {c: i for i, c in enumerate(CAUSES)}  # a row's cause may be none of them ("unknown")
    ordered = sorted(causes, key=lambda r: (r["benchmark"], label(r), rank.get(r["cause"], len(rank)), r["cause"]))
    return [[r["benchmark"], label(r), r["cause"], r["n"], r["share"]] for r in ordered]


def pec_chart(rows: list[list[Any]], colours: dict[str, str] | None = None) -> Chart:
    colours = colours or cohort_colours(r[1] for r in rows)
    panels = _by_panel(rows)
    with plt.rc_context(_STYLE):
        if max((len(s) for s in panels.values()), default=0) <= MAX_OVERLAID:
            fig, axes = _grid(len(panels))
            legend: dict[str, Handle] = {}  # drawn label -> its first line
            for ax, (benchmark, series) in zip(axes, panels.items(), strict=True):
                for condition, pts in series.items():
                    legend.setdefault(literal(condition), _pec_line(ax, pts, colours[condition]))
                _pec_axes(ax, literal(benchmark))
            _legend(fig, legend)
        else:  # small multiples: one panel per cohort, the others in grey behind it
            cells = [(b, c) for b, series in panels.items() for c in series]
            fig, axes = _grid(len(cells), ncols=4, legend=False)
            for ax, (benchmark, condition) in zip(axes, cells, strict=True):
                for other, pts in panels[benchmark].items():
                    if other != condition:
                        ax.plot([p[2] for p in pts], [p[3] for p in pts], color="#cccccc", linewidth=0.8)
                _pec_line(ax, panels[benchmark][condition], colours[condition])
                _pec_axes(ax, f"{literal(benchmark)} · {literal(condition)}")
        columns = ["benchmark", "condition", "k", "pec", "lo", "hi"]
        return _chart("pec_curves", "PEC(k) with 95% intervals", columns, rows, fig)


def fed_chart(rows: list[list[Any]], colours: dict[str, str] | None = None) -> Chart:
    """Shares by first-error depth on a true depth axis (empty depths keep their place), and the share of
    executable rollouts in a narrow panel of its own beside it."""
    with plt.rc_context(_STYLE):
        fig = fed_figure(rows, colours)
        columns = ["benchmark", "condition", "fed_bin", "n", "share"]
        return _chart("fed_histogram", "First-error depth (FED)", columns, rows, fig)


def fed_figure(rows: list[list[Any]], colours: dict[str, str] | None = None) -> Figure:
    """The figure of `fed_chart`, open for its caller to inspect or save (and close)."""
    colours = colours or cohort_colours(r[1] for r in rows)
    panels = _by_panel(rows)
    depth_axes: list[Axes] = []
    with plt.rc_context(_STYLE):
        n = max(len(panels), 1)
        depth_max = max((int(r[2]) for r in rows if r[2] != EXECUTABLE), default=1)
        fig = plt.figure(figsize=(_PANEL[0] * 1.25 * n, _PANEL[1]), layout="constrained")
        grid = fig.add_gridspec(1, 2 * n, width_ratios=[max(depth_max, 4), 1.3] * n)
        legend: dict[str, Handle] = {}  # drawn label -> its first bars
        for i, (benchmark, series) in enumerate(panels.items()):
            ax = fig.add_subplot(grid[0, 2 * i])
            ex = fig.add_subplot(grid[0, 2 * i + 1], sharey=ax)
            width = 0.8 / max(len(series), 1)
            for s, (condition, pts) in enumerate(series.items()):
                offset = (s - (len(series) - 1) / 2) * width
                depth = [(int(p[2]), p[4]) for p in pts if p[2] != EXECUTABLE]
                bars = ax.bar([d + offset for d, _ in depth], [v for _, v in depth], width, color=colours[condition])
                legend.setdefault(literal(condition), bars)
                executable = next((p[4] for p in pts if p[2] == EXECUTABLE), 0.0)
                ex.bar([offset], [executable], width, color=colours[condition])
            ax.set(title=literal(benchmark), xlabel="first-error depth (FED)", ylabel="share of rollouts")
            ax.set_xlim(0.4, depth_max + 0.6)
            depth_axes.append(ax)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ex.set_xticks([0], [EXECUTABLE])
            ex.set_xlim(-0.6, 0.6)
            ex.tick_params(axis="y", labelleft=False)
            ex.spines["left"].set_linestyle((0, (2, 2)))
        _legend(fig, legend)
        _spaced_depth_ticks(fig, depth_axes, depth_max)
        return fig


def _spaced_depth_ticks(fig: Figure, axes: list[Axes], depth_max: int) -> None:
    """Integer depth ticks spaced for their labels: the panel's width is only known once the layout has
    placed the legend and the executable panel, and a locator left to itself crowds two-digit depths on a narrow
    panel until their labels run into each other ("101214")."""
    fig.canvas.draw()  # the constrained layout settles each panel's width
    size = matplotlib.font_manager.FontProperties(size=plt.rcParams["xtick.labelsize"]).get_size_in_points()
    label_in = len(str(depth_max)) * size * 0.62 / 72  # DejaVu Sans digits are 0.62 em wide
    for ax in axes:
        width_in = ax.get_window_extent().width / fig.dpi
        bins = max(1, int(width_in / (1.5 * label_in)))  # half a label's width between two at the least
        ax.xaxis.set_major_locator(MaxNLocator(nbins=bins, integer=True, min_n_ticks=1))


def cause_chart(rows: list[list[Any]]) -> Chart:
    """Shares of first-error causes per cohort (each cause in its own colour), with the counts: n (rollouts
    with an invalid prefix) under each bar, the count in each segment that has room for it."""
    bars = list(dict.fromkeys((r[0], r[1]) for r in rows))
    rank = {c: i for i, c in enumerate(CAUSES)}
    causes = sorted({r[2] for r in rows}, key=lambda c: (rank.get(c, len(rank)), c))
    by = {(r[0], r[1], r[2]): r for r in rows}
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(max(_PANEL[0], 1.0 * len(bars) + 2.2), _PANEL[1] + 0.4), layout="constrained")
        bottom = [0.0] * len(bars)
        legend: dict[str, Handle] = {}  # drawn cause -> its bars
        x = list(range(len(bars)))
        for cause in causes:
            segs = [by.get((b, c, cause)) for b, c in bars]
            heights = [s[4] if s else 0.0 for s in segs]
            legend[literal(cause)] = ax.bar(x, heights, 0.65, bottom=bottom, color=cause_colour(cause))
            for i, s in enumerate(segs):
                if s and s[4] >= 0.07:  # counts where they fit
                    ax.text(i, bottom[i] + s[4] / 2, str(s[3]), ha="center", va="center", fontsize=8,
                            color=_ink(cause_colour(cause)))  # fmt: skip
            bottom = [a + h for a, h in zip(bottom, heights, strict=True)]
        totals = {(r[0], r[1]): 0 for r in rows}
        for r in rows:
            totals[(r[0], r[1])] += r[3]
        several = len({b for b, _ in bars}) > 1  # name the benchmark only when there is a choice
        ax.set_xticks(x, [_bar_label(b, c, totals[(b, c)], several) for b, c in bars])
        ax.set(ylabel="share of rollouts with an invalid prefix", ylim=(0, 1.0))
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        _add_legend(fig, legend, list(legend), "first-error cause")
        columns = ["benchmark", "condition", "cause", "n", "share"]
        return _chart("first_causes", "First-error cause", columns, rows, fig)


def _bar_label(benchmark: str, condition: str, n: int, with_benchmark: bool) -> str:
    """One label part per line (long cohort labels do not run into their neighbours), then n."""
    parts = ([benchmark] if with_benchmark else []) + [condition]
    return "\n".join([*map(_wrapped, parts), f"n={n}"])


def _wrapped(label: str) -> str:
    """A label from data as drawn: literal, one line per ' · ' part, a long part wrapped (a model's full path
    would otherwise take the width the panels need)."""
    parts = literal(label).split(" · ")
    return "\n".join(line for part in parts for line in textwrap.wrap(part, _LABEL_WIDTH) or [""])


def _pec_line(ax: Axes, pts: list[list[Any]], colour: str) -> Handle:
    k = [p[2] for p in pts]
    lo = [p[3] if p[4] is None else p[4] for p in pts]
    hi = [p[3] if p[5] is None else p[5] for p in pts]
    ax.fill_between(k, lo, hi, color=colour, alpha=0.13, linewidth=0)
    return ax.plot(k, [p[3] for p in pts], color=colour, marker="o", markersize=2.5, linewidth=1.4)[0]


def _pec_axes(ax: Axes, title: str) -> None:
    ax.set(title=title, xlabel="depth k", ylabel="PEC(k)", ylim=(0, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _legend(fig: Figure, handles: dict[str, Handle]) -> None:
    """One legend for the figure (a cohort has one colour in every panel), outside the plotting area. The handles
    are given, label by label: matplotlib's own collection would leave out a label that starts with '_'."""
    if handles:
        labels = [_wrapped(label) if len(label) > _LABEL_WIDTH else label for label in handles]
        _add_legend(fig, handles, labels, "cohort")


def _add_legend(fig: Figure, handles: dict[str, Handle], labels: list[str], title: str) -> None:
    # matplotlib's stubs take Artists only; a legend takes a BarContainer too (its default handler map has one).
    fig.legend(list(handles.values()), labels, loc="outside right upper", title=title)  # type: ignore[arg-type]


def _ink(colour: str) -> str:
    """Black or white text, whichever reads on the colour."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def _by_panel(rows: list[list[Any]]) -> dict[str, dict[str, list[list[Any]]]]:
    panels: dict[str, dict[str, list[list[Any]]]] = {}
    for r in rows:
        panels.setdefault(r[0], {}).setdefault(r[1], []).append(r)
    return panels


def _grid(n: int, ncols: int | None = None, legend: bool = True) -> tuple[Figure, list[Axes]]:
    n = max(n, 1)
    ncols = min(n, ncols or n)
    nrows = -(-n // ncols)
    width = _PANEL[0] * ncols + (1.6 if legend else 0.0)  # room for the legend beside the panels
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, _PANEL[1] * nrows), squeeze=False, layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _chart(name: str, title: str, columns: list[str], rows: list[list[Any]], fig: Figure) -> Chart:
    plt.close(fig)  # out of pyplot's list of open figures; the Chart keeps it to render its files
    return Chart(name, title, columns, rows, fig)


def tool_rows(tools: list[ToolProfile], label: Label) -> list[list[Any]]:
    """[benchmark, condition, tool, calls, invalid rate, lo, hi] per step-level cohort (tool_profiles)."""
    rows: list[list[Any]] = []
    for t in tools:
        rate = t["invalid_rate"]
        rows.append([t["benchmark"], label(t), t["tool"], t["n_calls"], rate["value"], rate["lo"], rate["hi"]])
    return rows


PAGE_WIDTH = 7.0  # inches: a page's text width (A4 or letter), at 300 dpi 2100 px
INVALID_CMAP = "OrRd"  # ColorBrewer's sequential orange-red: a higher invalid rate reads darker in any colour vision
_CELL = (0.95, 0.32)  # inches per heat-map cell at most (width, height)


def tool_chart(rows: list[list[Any]]) -> Chart:
    """Invalid rate per tool and cohort as a heat map (tools down, cohorts across, one panel per benchmark), with
    the rate and its task-clustered interval written in each cell."""
    columns = ["benchmark", "condition", "tool", "calls", "invalid_rate", "lo", "hi"]
    title = "Invalid rate per tool (95% task-clustered interval)"
    with plt.rc_context(_STYLE):  # saved in the style too: text kept as text, stable SVG ids
        return _chart("tool_invalid_rates", title, columns, rows, tool_figure(rows))


def tool_figure(rows: list[list[Any]]) -> Figure:
    """The heat map of tool_chart, at most one page wide (PAGE_WIDTH): cells narrow and text shrinks as cohorts
    are added, and the layout makes room for every label (tool names, cohort labels split at ' · ')."""
    panels = _by_panel(rows)
    grids = {b: _tool_grid(series) for b, series in panels.items()} or {"": ([], [], {})}
    n_cols = max(len(conditions) for _, conditions, _ in grids.values()) or 1
    label_chars = max((len(literal(t)) for tools, _, _ in grids.values() for t in tools), default=4)
    label_width = min(0.065 * label_chars + 0.3, 2.4)  # inches the tool names take at 9 pt
    cell_width = min(_CELL[0], (PAGE_WIDTH - label_width - 0.9) / n_cols)
    font = 8.0 if cell_width >= 0.7 else 6.5 if cell_width >= 0.5 else 5.0
    header = max((len(c.split(" · ")) for _, conditions, _ in grids.values() for c in conditions), default=1)
    heights = [max(len(tools), 1) * _CELL[1] + 0.16 * header + 0.45 for tools, _, _ in grids.values()]
    width = min(PAGE_WIDTH, label_width + n_cols * cell_width + 0.9)
    cmap = plt.get_cmap(INVALID_CMAP)
    with plt.rc_context(_STYLE):
        fig = plt.figure(figsize=(width, sum(heights) + 0.3), layout="constrained")
        axes = fig.subplots(len(grids), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
        images = []  # one per panel; `grids` has one at least
        for ax, (benchmark, (tools, conditions, cells)) in zip(axes, grids.items(), strict=True):
            rates = [[_rate(cells.get((t, c))) for c in conditions] for t in tools]
            image = ax.imshow(rates or [[float("nan")]], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
            images.append(image)
            image.cmap.set_bad("#f2f2f2")  # no calls of the tool in that cohort
            for i, t in enumerate(tools):
                for j, c in enumerate(conditions):
                    text, rate = _cell_text(cells.get((t, c))), _rate(cells.get((t, c)))
                    ink = "#555555" if rate != rate else _ink(matplotlib.colors.to_hex(cmap(rate)))
                    ax.text(j, i, text, ha="center", va="center", fontsize=font, color=ink, linespacing=1.1)
            ax.set_xticks(range(len(conditions)), [literal(c).replace(" · ", "\n") for c in conditions],
                          fontsize=font + 0.5)  # fmt: skip
            ax.set_yticks(range(len(tools)), [literal(t) for t in tools])
            ax.tick_params(top=False, bottom=False, left=False, labeltop=True, labelbottom=False)
            ax.spines[:].set_visible(False)
            ax.set_xticks([x - 0.5 for x in range(1, len(conditions))], minor=True)
            ax.set_yticks([y - 0.5 for y in range(1, len(tools))], minor=True)
            ax.grid(which="minor", color="white", linewidth=1.5)
            ax.tick_params(which="minor", length=0)
            ax.set_title(literal(benchmark), loc="left")
        bar = fig.colorbar(images[-1], ax=list(axes), location="bottom", shrink=0.6, aspect=30, pad=0.01)
        bar.set_label("invalid calls (share of the tool's calls); cell: rate and its interval")
        bar.ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    return fig


Cell = list[Any]  # a tool_rows row


def _tool_grid(series: dict[str, list[Cell]]) -> tuple[list[str], list[str], dict[tuple[str, str], Cell]]:
    """A panel's tools (sorted), cohorts (as given) and its cells by (tool, cohort)."""
    cells = {(p[2], condition): p for condition, pts in series.items() for p in pts}
    return sorted({t for t, _ in cells}), list(series), cells


def _rate(cell: Cell | None) -> float:
    return float("nan") if cell is None or cell[4] is None else float(cell[4])


def _cell_text(cell: Cell | None) -> str:
    """The rate, then its interval (whole percent, one decimal below 10%)."""
    if cell is None or cell[4] is None:
        return "no calls"
    lo, hi = (cell[4] if cell[5] is None else cell[5]), (cell[4] if cell[6] is None else cell[6])
    return f"{_percent(cell[4])}\n{_percent(lo)}–{_percent(hi)}"


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%" if 0 < x < 0.1 else f"{100 * x:.0f}%"
