"""How every `pexec bench` prints its figures: project / baseline / ratio, each as min–median–max over the
repetitions, in a terminal table or as the Markdown tables docs/reference/benchmarks.md is made of.

A figure without a natural baseline (peak memory, a projection) says so in its baseline cell instead of
inventing one. A figure measured with its CPU-seconds (`cpu`, `baseline_cpu`: per repetition, the measuring process
and its children, Ray's included) is followed by a row of them, whose ratio holds when the machine's load moves
wall-clock figures; a bench run by `pexec bench` ends its caption with what the whole run cost (`Usage`: wall,
CPU-seconds, the load average during it, the niceness of its processes and of Ray's workers).

Markdown blocks sit between `<!-- bench:start NAME -->` and `<!-- bench:end NAME -->`, one per bench, so that
`pexec bench NAME --readme docs/reference/benchmarks.md` replaces its own block and nothing else. A block's caption
ends with the day its figures were measured: the only place a figure carries its date.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.core.errors import PexecError


@dataclass(frozen=True)
class Figure:
    """One measured quantity: the project's value per repetition, and the baseline's measured in the same
    repetitions (None with `baseline` naming why there is none)."""

    name: str  # what is measured, on what population
    unit: str  # "steps/s per core", "s", "MiB"...
    project: tuple[float, ...]
    baseline: str  # what the baseline is ("naive loop, one core"), or why there is none ("none: peak memory")
    baseline_values: tuple[float, ...] | None = None
    cpu: tuple[float, ...] | None = None  # CPU-seconds of each repetition of the project (None: not measured)
    baseline_cpu: tuple[float, ...] | None = None  # and of the baseline, in the same repetitions

    def __post_init__(self) -> None:
        if not self.project:
            raise ValueError(f"figure {self.name!r} has no measurement")
        if self.baseline_values is not None and len(self.baseline_values) != len(self.project):
            raise ValueError(f"figure {self.name!r}: baseline and project measured a different number of times")
        for cpu in (self.cpu, self.baseline_cpu):
            if cpu is not None and len(cpu) != len(self.project):
                raise ValueError(f"figure {self.name!r}: CPU time measured a different number of times")
        if self.baseline_cpu is not None and (self.cpu is None or self.baseline_values is None):
            raise ValueError(f"figure {self.name!r}: a baseline's CPU time without the project's or the baseline")

    def cpu_figure(self) -> Figure | None:
        """The row of CPU-seconds that follows this figure (None when they were not measured)."""
        if self.cpu is None:
            return None
        name = "↳ CPU time of the row above (its processes and their children, Ray's included)"
        if self.baseline_cpu is None:
            return Figure(name, "CPU-s", self.cpu, "none: the baseline's was not measured")
        return Figure(name, "CPU-s", self.cpu, self.baseline, self.baseline_cpu)

    @property
    def ratios(self) -> tuple[float, ...] | None:
        """project / baseline per repetition (paired: both measured in the same repetition); None without a
        baseline or when a value is not positive (a growth of about zero has no meaningful ratio)."""
        if self.baseline_values is None or min(self.project + self.baseline_values) <= 0:
            return None
        return tuple(p / b for p, b in zip(self.project, self.baseline_values, strict=True))


@dataclass(frozen=True)
class Usage:
    """What a measurement cost the machine: wall seconds, CPU-seconds of the measuring process and its children
    (Ray's included), the 1-minute load average sampled during it, and the niceness of the processes seen."""

    wall_s: float
    cpu_s: float
    load: tuple[float, ...]  # sampled every `Meter.every` seconds, first and last included
    nice: tuple[int, ...] = ()  # of every process of the tree but Ray's workers
    ray_worker_nice: tuple[int, ...] = ()  # of Ray's workers (none seen: no Ray, or one not started by the tree)
    counted_by: str = "tree"  # "cgroup": the kernel's count for every process started; "tree": read from /proc

    def text(self) -> str:
        """`… s wall, … CPU-s; load average min–median–max; niceness …`, for a caption."""
        load = "–".join(f"{x:.1f}" for x in (min(self.load), statistics.median(self.load), max(self.load)))
        nice = f"processes at nice {_values(self.nice)}"
        if self.ray_worker_nice:
            nice += f", Ray workers at nice {_values(self.ray_worker_nice)}"
        counted = {"cgroup": "every process it started, Ray's included, counted by the kernel in a cgroup",
                   "tree": "the bench process and its descendants, read from /proc; Ray's workers that ended before "
                           "it are missed"}[self.counted_by]  # fmt: skip
        return (f"{_seconds(self.wall_s)} s wall, {_seconds(self.cpu_s)} CPU-s ({counted}); load average {load} "
                f"(min–median–max during it); {nice}")  # fmt: skip


def _seconds(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _values(values: tuple[int, ...]) -> str:
    seen = sorted(set(values))
    return " and ".join(str(v) for v in seen) if seen else "–"


@dataclass(frozen=True)
class Bench:
    """What one `pexec bench NAME` measured: a caption (sizes, machine load, repetitions) and its figures;
    `details` keeps the raw measurements for scripts."""

    name: str
    caption: str
    figures: list[Figure]
    details: Mapping[str, object] = field(default_factory=dict)  # each bench's own raw measurements
    measured: str = field(default_factory=lambda: datetime.now(UTC).date().isoformat())  # the day, UTC
    usage: Usage | None = None  # what the whole run cost, set by `pexec bench` (registry.Entry.run)

    @property
    def full_caption(self) -> str:
        """The caption, then what the whole run cost when it was measured."""
        return self.caption if self.usage is None else f"{self.caption}; whole run: {self.usage.text()}"


def n_runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"


def load_average(before: float) -> str:
    """The machine's 1-minute load average before the bench (`before`, os.getloadavg()[0]) and now: every
    figure is wall-clock time on a machine that may be shared (`Usage` adds the load sampled during the run)."""
    return f"load average {before:.1f} → {os.getloadavg()[0]:.1f}"


def figure(
    name: str,
    unit: str,
    project: Sequence[float],
    baseline: str,
    baseline_values: Sequence[float] | None = None,
    *,
    cpu: Sequence[float] | None = None,
    baseline_cpu: Sequence[float] | None = None,
) -> Figure:
    """A figure; `cpu` and `baseline_cpu`, the CPU-seconds of each repetition, add a row of them after it."""
    return Figure(name, unit, tuple(project), baseline, _tuple(baseline_values), _tuple(cpu), _tuple(baseline_cpu))


def _tuple(values: Sequence[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(values)


def number(x: float) -> str:
    """Three significant digits at most below 1,000, whole numbers with separators above."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1 or x == 0:
        return f"{x:.2f}"
    return f"{x:#.3g}"


def spread(values: Sequence[float], unit: str = "") -> str:
    """min–median–max of repeated measurements (one value when measured once)."""
    suffix = f" {unit}" if unit else ""
    if len(values) == 1:
        return f"{number(values[0])}{suffix}"
    return f"{number(min(values))}–{number(statistics.median(values))}–{number(max(values))}{suffix}"


def rows(figures: Sequence[Figure]) -> list[list[str]]:
    """figure | runs | project | baseline | project / baseline, as cells; a figure measured with its CPU time is
    followed by a row of it."""
    out = []
    for f in _with_cpu(figures):
        if f.baseline_values is None:
            baseline, ratio = f.baseline, "–"
        else:
            baseline = f"{spread(f.baseline_values, f.unit)} ({f.baseline})"
            ratio = "–" if f.ratios is None else f"{spread(f.ratios)}×"
        out.append([f.name, str(len(f.project)), spread(f.project, f.unit), baseline, ratio])
    return out


def _with_cpu(figures: Sequence[Figure]) -> list[Figure]:
    out = []
    for f in figures:
        out.append(f)
        if (cpu := f.cpu_figure()) is not None:
            out.append(cpu)
    return out


HEADER = ["figure", "runs", "project (min–median–max)", "baseline (same runs)", "project / baseline"]


def markdown(bench: Bench) -> str:
    """The caption in italics, ending with the day of the measurement, then the table."""
    lines = [
        f"_{bench.full_caption}; measured {bench.measured}_",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows(bench.figures)]
    return "\n".join(lines)


def show(bench: Bench, console: Console | None = None) -> None:
    table = Table(title=bench.full_caption, title_justify="left")
    for i, column in enumerate(HEADER):
        table.add_column(column, justify="left" if i in (0, 3) else "right", overflow="fold")
    for row in rows(bench.figures):
        table.add_row(*row)
    console = console or Console(markup=False, emoji=False, highlight=False)
    if not console.is_terminal:
        console.width = 200  # a log or a pipe: no wrapping at 80 columns
    console.print(table)


def block(bench: Bench) -> str:
    """The Markdown block of `bench`, markers included."""
    return f"<!-- bench:start {bench.name} -->\n{markdown(bench)}\n<!-- bench:end {bench.name} -->"


def blocks(text: str) -> dict[str, str]:
    """name -> what lies between a Markdown file's bench markers."""
    found = re.finditer(r"<!-- bench:start (\w+) -->\n(.*?)\n<!-- bench:end \1 -->", text, re.S)
    return {m.group(1): m.group(2) for m in found}


def replace_block(path: Path, bench: Bench) -> None:
    """Replace `bench`'s block in the Markdown file at `path`; refuses when the file has no such block."""
    text = path.read_text()
    start, end = f"<!-- bench:start {bench.name} -->", f"<!-- bench:end {bench.name} -->"
    pattern = re.compile(rf"{re.escape(start)}\n.*?\n{re.escape(end)}", re.S)
    if not pattern.search(text):
        raise PexecError(f"{path} has no {start} … {end} block to replace")
    path.write_text(pattern.sub(lambda _: block(bench), text, count=1))
