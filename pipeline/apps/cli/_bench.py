"""`pexec bench NAME`: one of the benches declared in pipeline/apps/perf/registry.py, printed as a table, as its
Markdown block (docs/reference/benchmarks.md), or written into that block."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.apps.cli._render import console
from pipeline.apps.perf.registry import BENCHES
from pipeline.core.errors import PexecError


def _listed(names: list[str], last: str = "and") -> str:
    """["a", "b", "c"] -> "a, b and c"."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


def _size(n: int) -> str:
    """220000 -> "220k", 1000000 -> "1M", 4000 -> "4,000"."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000:,}M"
    return f"{n // 1000:,}k" if n >= 10_000 and n % 1000 == 0 else f"{n:,}"


_SIZED = [f"{name} {_size(e.default)}" + (f" ({e.note})" if e.note else "") for name, e in BENCHES.items() if e.size]
_FIXED = [name for name, e in BENCHES.items() if not e.size]
ROLLOUTS_HELP = f"Store size in rollouts; default: {', '.join(_SIZED)}; {_listed(_FIXED)} have a fixed size."
WORKDIR_HELP = (
    f"Where to put the generated data ({_listed([name for name, e in BENCHES.items() if e.workdir])}); nightly "
    "reuses the data it wrote there for a run of the same size."
)


def bench(
    what: Annotated[str, typer.Argument(help=", ".join(BENCHES))] = "replay",
    rollouts: Annotated[int | None, typer.Option("--rollouts", min=1, max=100_000_000, help=ROLLOUTS_HELP)] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", help=WORKDIR_HELP)] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats", min=1, max=100, help="Runs of every measurement (default 3; scale 1, view and tau 5)."
        ),
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the Markdown block (docs/reference/benchmarks.md) instead.")
    ] = False,
    readme: Annotated[
        Path | None,
        typer.Option(
            "--readme", help="Replace this bench's block in this Markdown file (docs/reference/benchmarks.md)."
        ),
    ] = None,
) -> None:
    """Benchmarks of pexec itself, each figure as project / baseline / ratio, min–median–max over the runs.

    Replay through Ray vs a naive baseline, the metrics stage vs a plain-numpy reference, the mergeable Poisson
    bootstrap, scale-out over S3, the viewer's page latency, the guard's latency per check, the scoring driver at
    cluster scale, local Ray's start against scoring in-process, BFCL and τ replay, OTel spans through the shuffle,
    and a night of raw production logs scored where they lie. Every run ends its caption with its wall time, its
    CPU-seconds (Ray's processes included), the load average during it and the niceness of its processes; Ray's
    workers run at nice 0, as the baselines do."""
    from pipeline.apps.perf import figures

    if what not in BENCHES:
        raise PexecError(f"bench takes {_listed(list(BENCHES), 'or')}")
    result = BENCHES[what].run(rollouts, workdir, repeats)
    if readme is not None:
        figures.replace_block(readme, result)
        console.print(f"{readme}: bench {what} block replaced")
    elif markdown:
        print(figures.block(result))
    else:
        figures.show(result)
