"""The report's figures: what each shows is computed by a pure function (its rows are also written as CSV and
tested); drawing is matplotlib (Agg), saved as PNG and SVG with fixed metadata so reruns give the same files."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from pipeline.model import CAUSES

EXECUTABLE = "executable"  # the FED bin of fully executable rollouts (FED = T + 1)

plt.rcParams["svg.hashsalt"] = "pexec"  # stable element ids in the SVG


@dataclass(frozen=True)
class Chart:
    name: str  # file stem under figures/
    title: str
    columns: list[str]
    rows: list[list[Any]]  # the data drawn, one row per point / bar segment
    png: bytes
    svg: str


def pec_rows(cohorts: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[list[Any]]:
    """[benchmark, condition, k, PEC(k), lo, hi] for every cohort and k."""
    return [[c["benchmark"], label(c), p["k"], p["value"], p["lo"], p["hi"]] for c in cohorts for p in c["pec"]]


def fed_rows(fed: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[list[Any]]:
    """[benchmark, condition, bin, n, share]; bins are the depths 1, 2, … then `executable`."""
    ordered = sorted(fed, key=lambda r: (r["benchmark"], label(r), r["executable"], r["fed"] or 0))
    return [
        [r["benchmark"], label(r), EXECUTABLE if r["executable"] else str(r["fed"]), r["n"], r["share"]]
        for r in ordered
    ]


def cause_rows(causes: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[list[Any]]:
    """[benchmark, condition, cause, n, share] in the fixed cause order (docs/design.md §3), unknown labels last."""
    rank = {c: i for i, c in enumerate(CAUSES)}
    ordered = sorted(causes, key=lambda r: (r["benchmark"], label(r), rank.get(r["cause"], len(rank)), r["cause"]))
    return [[r["benchmark"], label(r), r["cause"], r["n"], r["share"]] for r in ordered]


def pec_chart(rows: list[list[Any]]) -> Chart:
    fig, axes = _panels(rows)
    for ax, (benchmark, series) in zip(axes, _by_panel(rows).items(), strict=True):
        for condition, pts in series.items():
            k = [p[2] for p in pts]
            line = ax.plot(k, [p[3] for p in pts], marker="o", markersize=3, label=condition)[0]
            lo = [p[3] if p[4] is None else p[4] for p in pts]
            hi = [p[3] if p[5] is None else p[5] for p in pts]
            ax.fill_between(k, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set(title=benchmark, xlabel="depth k", ylabel="PEC(k)", ylim=(0, 1.02))
        ax.legend(fontsize=7)
    return _chart(
        "pec_curves", "PEC(k) with 95% intervals", ["benchmark", "condition", "k", "pec", "lo", "hi"], rows, fig
    )


def fed_chart(rows: list[list[Any]]) -> Chart:
    fig, axes = _panels(rows)
    for ax, (benchmark, series) in zip(axes, _by_panel(rows).items(), strict=True):
        bins = sorted({p[2] for pts in series.values() for p in pts}, key=_bin_order)
        width = 0.8 / max(len(series), 1)
        for s, (condition, pts) in enumerate(series.items()):
            share = {p[2]: p[4] for p in pts}
            ax.bar([i + s * width for i in range(len(bins))], [share.get(b, 0.0) for b in bins], width, label=condition)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(bins))], bins, fontsize=7)
        ax.set(title=benchmark, xlabel="first-error depth (FED)", ylabel="share of rollouts")
        ax.legend(fontsize=7)
    columns = ["benchmark", "condition", "fed_bin", "n", "share"]
    return _chart("fed_histogram", "First-error depth (FED)", columns, rows, fig)


def cause_chart(rows: list[list[Any]]) -> Chart:
    bars = list(dict.fromkeys((r[0], r[1]) for r in rows))
    causes = list(dict.fromkeys(r[2] for r in rows))
    share = {(r[0], r[1], r[2]): r[4] for r in rows}
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(bars) + 2), 3.6))
    bottom = [0.0] * len(bars)
    x = range(len(bars))
    for cause in causes:
        heights = [share.get((b, c, cause), 0.0) for b, c in bars]
        ax.bar(x, heights, 0.6, bottom=bottom, label=cause)
        bottom = [a + h for a, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(list(x), [f"{b}\n{c}" for b, c in bars], fontsize=7)
    ax.set(ylabel="share of rollouts with an invalid prefix", ylim=(0, 1.0))
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    columns = ["benchmark", "condition", "cause", "n", "share"]
    return _chart("first_causes", "First-error cause", columns, rows, fig)


def _bin_order(b: str) -> tuple[int, int]:
    return (1, 0) if b == EXECUTABLE else (0, int(b))


def _by_panel(rows: list[list[Any]]) -> dict[str, dict[str, list[list[Any]]]]:
    panels: dict[str, dict[str, list[list[Any]]]] = {}
    for r in rows:
        panels.setdefault(r[0], {}).setdefault(r[1], []).append(r)
    return panels


def _panels(rows: list[list[Any]]) -> tuple[Figure, list[Any]]:
    n = max(len({r[0] for r in rows}), 1)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 3.6), squeeze=False)
    return fig, list(axes[0][: len({r[0] for r in rows})])


def _chart(name: str, title: str, columns: list[str], rows: list[list[Any]], fig: Figure) -> Chart:
    fig.suptitle(title)
    fig.tight_layout()
    png, svg = io.BytesIO(), io.StringIO()
    fig.savefig(png, format="png", dpi=100, metadata={"Software": None})
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return Chart(name, title, columns, rows, png.getvalue(), svg.getvalue())
