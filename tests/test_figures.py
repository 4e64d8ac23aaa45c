"""The report's figures as a paper takes them: fixed colours per cause and per cohort, integer depth axes, a
true FED depth axis with the executable bar apart, counts on the cause bars, 300 dpi PNG + PDF + SVG with text
kept as text, small multiples past eight cohorts; and each drawing compared with a checked-in reference PNG.

Regenerate the references deliberately with PEXEC_REGEN_FIGURES=1 (then look at them before committing).
"""

from __future__ import annotations

import html
import io
import itertools
import os
import re
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.testing.compare import compare_images
from matplotlib.text import Text
from PIL import Image

from pipeline.report._figures import (
    CAUSE_COLOURS,
    COHORT_PALETTE,
    Chart,
    cause_chart,
    cohort_colours,
    fed_chart,
    fed_figure,
    pec_chart,
    tool_chart,
    tool_figure,
)

REFERENCES = Path(__file__).parent / "golden" / "figures"
COHORTS = ["model-a · react", "model-b · react", "model-c · plan"]


def pec_rows(cohorts: list[str], benchmarks: tuple[str, ...] = ("shop", "bank")) -> list[list]:
    rows = []
    for b, bench in enumerate(benchmarks):
        for i, c in enumerate(cohorts):
            for k in range(8):
                v = max(0.0, 1.0 - k * (0.09 + 0.02 * i + 0.01 * b))
                rows.append([bench, c, k, v, max(0.0, v - 0.06), min(1.0, v + 0.05)])
    return rows


def fed_rows() -> list[list]:
    # Depths 3, 4, 6-8 are empty: they keep their place on the axis.
    shares = {"1": 0.2, "2": 0.15, "5": 0.1, "9": 0.05, "executable": 0.5}
    return [["shop", c, d, int(100 * s), s - 0.02 * i if d == "1" else s] for i, c in enumerate(COHORTS)
            for d, s in shares.items()]  # fmt: skip


def cause_rows() -> list[list]:
    rows = []
    for i, c in enumerate(COHORTS):
        counts = {"schema": 10 + i, "dependency": 30, "precondition": 20 - 5 * i, "tool_crash": 3}
        total = sum(counts.values())
        rows += [["shop", c, cause, n, n / total] for cause, n in counts.items()]
    return rows


TOOLS = [
    "get_order", "cancel_order", "find_customer", "track_shipment", "update_address", "apply_coupon", "list_products",
    "get_product", "place_order", "refund_payment", "update_shipping_address_for_pending_order", "get_user_details",
    "list_orders", "exchange_items", "return_items", "get_reservation", "book_reservation", "search_direct_flight",
    "search_onestop_flight", "update_reservation_flights", "update_reservation_baggages", "cancel_reservation",
    "send_certificate", "transfer_to_human_agents", "calculate", "think", "list_all_airports", "get_flight_status",
    "modify_payment_method", "update_reservation_passengers",
]  # fmt: skip
TOOL_COHORTS = [*COHORTS, "model-d · plan-and-execute"]


def tool_rows(n_tools: int) -> list[list]:
    """[benchmark, condition, tool, calls, rate, lo, hi] for n_tools tools x 4 cohorts; one cohort never calls the
    second tool, one rate is below 10% (one decimal), one is 0."""
    rows = []
    for i, tool in enumerate(TOOLS[:n_tools]):
        for j, c in enumerate(TOOL_COHORTS):
            if (i, j) == (1, 3):
                continue
            rate = ((7 * i + 13 * j) % 19) / 20 if (i, j) != (2, 0) else 0.0
            rate = 0.042 if (i, j) == (0, 1) else rate
            rows.append(["tau_retail", c, tool, 40 + i, rate, max(0.0, rate - 0.08), min(1.0, rate + 0.09)])
    return rows


CHARTS = {
    "pec_curves": lambda: pec_chart(pec_rows(COHORTS), cohort_colours(COHORTS)),
    "pec_small_multiples": lambda: pec_chart(pec_rows([f"cohort-{i:02d}" for i in range(10)], ("shop",))),
    "fed_histogram": lambda: fed_chart(fed_rows(), cohort_colours(COHORTS)),
    "first_causes": lambda: cause_chart(cause_rows()),
    "tool_invalid_rates_11": lambda: tool_chart(tool_rows(11)),
    "tool_invalid_rates_30": lambda: tool_chart(tool_rows(30)),
}


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_figure_matches_its_reference(name: str, tmp_path: Path) -> None:
    chart: Chart = CHARTS[name]()
    # Compared at a third of the 300 dpi (small references; still every label and bar).
    image = Image.open(io.BytesIO(chart.png))
    small = image.resize((image.width // 3, image.height // 3), Image.Resampling.LANCZOS)
    actual = tmp_path / f"{name}.png"
    small.save(actual)
    reference = REFERENCES / f"{name}.png"
    if os.environ.get("PEXEC_REGEN_FIGURES"):
        reference.parent.mkdir(parents=True, exist_ok=True)
        small.save(reference)
    assert compare_images(str(reference), str(actual), tol=2) is None


def test_formats_for_a_paper() -> None:
    chart = CHARTS["pec_curves"]()
    png = Image.open(io.BytesIO(chart.png))
    assert round(png.info["dpi"][0]) == 300
    assert chart.pdf.startswith(b"%PDF-")
    # Text is text: labels are searchable in the SVG, not glyph paths.
    assert ">PEC(k)</text>" in chart.svg and ">model-b · react</text>" in chart.svg
    assert "DejaVu Sans" in chart.svg
    again = CHARTS["pec_curves"]()  # no dates or random ids: a rerun writes the same bytes
    assert (again.png, again.svg, again.pdf) == (chart.png, chart.svg, chart.pdf)


def test_a_cause_has_one_colour_whatever_else_is_drawn() -> None:
    only = cause_chart([["shop", "a", "precondition", 5, 1.0]])
    mixed = cause_chart(cause_rows())
    assert CAUSE_COLOURS["precondition"].lower() in only.svg.lower()
    assert CAUSE_COLOURS["precondition"].lower() in mixed.svg.lower()
    assert CAUSE_COLOURS["schema"].lower() not in only.svg.lower()


def test_a_cohort_has_one_colour_in_every_figure() -> None:
    colours = cohort_colours(["b", "c", "a"])
    assert colours == {"a": COHORT_PALETTE[0], "b": COHORT_PALETTE[1], "c": COHORT_PALETTE[2]}
    # Only cohort b drawn: it keeps b's colour (not the first colour) in the PEC and the FED figure alike.
    pec = pec_chart([r for r in pec_rows(["b"]) if r[0] == "shop"], colours)
    fed = fed_chart([["shop", "b", "1", 3, 0.3], ["shop", "b", "executable", 7, 0.7]], colours)
    for chart in (pec, fed):
        assert COHORT_PALETTE[1].lower() in chart.svg.lower()
        assert COHORT_PALETTE[0].lower() not in chart.svg.lower()


def test_cause_bars_carry_their_counts() -> None:
    chart = cause_chart(cause_rows())
    for i, _ in enumerate(COHORTS):
        total = 10 + i + 30 + 20 - 5 * i + 3
        assert f">n={total}</text>" in chart.svg.replace("\n", "")
    assert ">30</text>" in chart.svg  # a segment's count


def test_depth_axes_have_integer_ticks_only() -> None:
    for name, expected in (
        ("pec_curves", [str(k) for k in range(8)] * 2),
        ("fed_histogram", [*"123456789", "executable"]),
    ):
        ticks = re.findall(r'<g id="xtick_\d+">.*?>([^<>]+)</text>', CHARTS[name]().svg, re.S)
        assert ticks == expected, name


@pytest.mark.parametrize("n_tools", [11, 30])
def test_the_tool_map_is_one_page_wide_and_cuts_no_label(n_tools: int) -> None:
    fig = tool_figure(tool_rows(n_tools))
    fig.canvas.draw()
    box = fig.bbox
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert len([t for t in texts if t.get_text() in TOOLS]) == n_tools
    for t in texts:
        extent = t.get_window_extent()
        x_in = box.x0 - 1 <= extent.x0 <= extent.x1 <= box.x1 + 1
        inside = x_in and box.y0 - 1 <= extent.y0 <= extent.y1 <= box.y1 + 1
        assert inside, f"{t.get_text()!r} is cut: {extent} outside {box}"
    width, _ = fig.get_size_inches()
    assert width * 300 <= 2100  # one page wide at 300 dpi
    plt.close(fig)


def test_the_tool_map_is_saved_for_a_paper_too() -> None:
    chart = CHARTS["tool_invalid_rates_11"]()
    assert ">update_shipping_address_for_pending_order</text>" in chart.svg and "DejaVu Sans" in chart.svg
    again = CHARTS["tool_invalid_rates_11"]()
    assert (again.png, again.svg, again.pdf) == (chart.png, chart.svg, chart.pdf)


def test_each_cell_states_the_rate_and_its_interval() -> None:
    fig = tool_figure(tool_rows(11))
    cells = {t.get_text() for t in fig.axes[0].texts}
    plt.close(fig)
    assert "35%\n27%–44%" in cells  # get_order x model-c: 0.35 [0.27, 0.44]
    assert "4.2%\n0%–13%" in cells  # below 10%: one decimal
    assert "no calls" in cells  # cancel_order x model-d
    assert len(cells & {"80%\n72%–89%", "85%\n77%–94%"}) == 2


def test_labels_from_data_are_drawn_as_text() -> None:
    """A label is data: `$...$` in it is not mathtext (a bad formula would stop the report), and a control
    character is drawn as its escape, not as an empty box (matplotlib would warn about the missing glyph)."""
    labels = ["m$\\frac$x · v$2$", "ok\x1b[31m · \u202eevil"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing-glyph warning fails the test
        charts = [
            pec_chart(pec_rows(labels, ("b$e$nch",))),
            fed_chart([["b$e$nch", c, "1", 3, 0.3] for c in labels]),
            cause_chart([["b$e$nch", c, "tool\ncrash", 3, 1.0] for c in labels]),
            tool_chart([["b$e$nch", c, "get$x$\x07", 4, 0.5, 0.4, 0.6] for c in labels]),
        ]
    for chart in charts:
        svg = html.unescape(chart.svg)
        shows_benchmark = chart.name != "first_causes"  # the cause bars name it only when there are several
        assert ("b$e$nch" in svg) == shows_benchmark and "m$\\frac$x" in svg, chart.name
        assert "\x1b" not in svg and "\u202e" not in svg and "\\x1b[31m" in svg, chart.name
    assert "tool\\ncrash" in html.unescape(charts[2].svg) and "get$x$\\x07" in html.unescape(charts[3].svg)
    assert charts[0].rows[0][1] == labels[0]  # the CSV keeps the label as it is


def test_a_long_cohort_label_is_wrapped_and_the_panels_keep_their_room() -> None:
    """A model's full path and a long method name: wrapped in the legend and under the bars, so the layout still
    fits (matplotlib would warn that the axes collapsed and drop the layout)."""
    long = "meta-llama/Llama-3.3-70B-Instruct-Turbo-with-a-long-suffix · plan_execute_with_reflection"
    labels = [long, "short · react"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        charts = [
            pec_chart(pec_rows(labels, ("shop",))),
            fed_chart([["shop", c, "1", 3, 0.3] for c in labels]),
            cause_chart([["shop", c, "schema", 3, 1.0] for c in labels]),
        ]
    for chart in charts:
        short = ">short</text>" if chart.name == "first_causes" else ">short · react</text>"  # bars: a part a line
        assert ">plan_execute_with_reflection</text>" in chart.svg and short in chart.svg, chart.name
        assert long not in chart.svg, chart.name  # not drawn on one line


def test_a_label_starting_with_an_underscore_keeps_its_legend_entry() -> None:
    """Matplotlib leaves '_'-prefixed labels out of a legend it collects itself: a cohort or cause named so would
    be drawn in a colour that nothing names."""
    labels = ["_internal · react", "model-a · react"]
    pec = pec_chart(pec_rows(labels, ("shop",)))
    fed = fed_chart([["shop", c, "1", 3, 0.3] for c in labels])
    causes = cause_chart([["shop", "model-a · react", cause, 3, 0.5] for cause in ("_probe_failed", "schema")])
    for chart in (pec, fed):
        assert ">_internal · react</text>" in chart.svg and ">model-a · react</text>" in chart.svg, chart.name
    assert ">_probe_failed</text>" in causes.svg and ">schema</text>" in causes.svg


@pytest.mark.parametrize("depth", [9, 10, 14, 17, 43, 120])
@pytest.mark.parametrize("cohorts", [1, 4, 9])
def test_fed_depth_labels_never_overlap(depth: int, cohorts: int) -> None:
    """Two-digit and three-digit depths on a panel narrowed by the legend and the executable panel: every depth
    label drawn keeps clear of its neighbours, and the axis still carries at least two of them."""
    labels = [f"model-{i} · react" for i in range(cohorts)]
    rows = [["shop", c, str(d), 1, 0.01] for c in labels for d in range(1, depth + 1)]
    rows += [["shop", c, "executable", 5, 0.5] for c in labels]
    fig = fed_figure(rows)
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        shown = [t for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
        boxes = sorted((t.get_window_extent() for t in shown), key=lambda b: b.x0)
        assert len(boxes) >= 2, [t.get_text() for t in shown]
        for left, right in itertools.pairwise(boxes):
            assert left.x1 < right.x0, [t.get_text() for t in shown]
    finally:
        plt.close(fig)
