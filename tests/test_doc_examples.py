"""The shell examples of the docs run as written.

Every ```bash block of the tutorial, of each how-to guide and of the README's tour runs, a page's blocks in order
in ONE bash process (`-e -o pipefail`), as a reader pastes them into one terminal: a server a page starts runs in
the background with what it needs exported, and the page stops it (a `trap … EXIT`). The shell starts from the
root of a temporary workspace that holds what the pages need (the repository's `specs/`, `jobs/`, `tests/`,
`infra/` and `Makefile`, and `.venv` pointing at this interpreter's environment), with `pexec` from this
environment on PATH. The page fails when its shell does not get to the end, when any block prints a traceback,
and when a block does not print what the page shows as its output (the plain block right after it; a `…` there
stands for what the page leaves out, durations, rates and clocks may differ). A few known outputs per page must
also be printed, and shown on the page.

A block that cannot run here (a Ray cluster, cloud credentials, a server that runs until Ctrl-C, a package
install) carries `<!-- not run: <why> -->` on the line right above it; the reason is required.

The README's tour and the SQL guide start from the run `make demo` writes; the workspace gets one made the same way
(same size, seed and shard size, scored in-process), so their commands run unchanged and print what the pages show.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from conftest import shared_ray_address, starts
from trace_servers import server_python, server_python_path

pytestmark = pytest.mark.docs
ROOT = Path(__file__).resolve().parents[1]
TOUR = "## A five-minute tour"  # the README's section whose blocks run; the rest of the README is not a walk-through
GUIDES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs/how-to").glob("*.md"))
PAGES = ["README.md", "docs/tutorial.md", *GUIDES]
# What the pages read from the repository (never written): `make mlflow-server` reads the Makefile and what its
# targets depend on.
SHARED = ("specs", "jobs", "tests", "infra", "Makefile", "pyproject.toml", "requirements.lock")
# Pages run without the suite's shared Ray, as in the reader's shell: a `pexec score` that starts a Ray of its own
# (the workers of the shared Ray do not have the credentials the page exports), or one that, given no Ray, scores a
# small input in-process and says so (with $RAY_ADDRESS set it would score on that Ray).
OWN_RAY = {
    "docs/how-to/run-on-a-cluster.md",
    "docs/tutorial.md",
    "docs/how-to/score-mlflow-traces.md",
    "docs/how-to/score-phoenix-traces.md",
}
NEEDS_DEMO_RUN = {"README.md", "docs/how-to/query-with-sql.md"}
BLOCK_TIMEOUT = 300  # seconds; a block stuck this long is a failure, not a slow machine
PAGES_AT_ONCE = 3

# Outputs each page's commands must print, and that the page itself shows (a page without runnable blocks has none).
EXPECTED = {
    "README.md": [
        "shard(s) reused",
        "model-b · react",
        "lookup_order",
        "report written to out/demo/compare/report.html",
    ],
    "docs/tutorial.md": [
        "wrote 400 rollouts over 40 tasks to out/tutorial/store",
        "truth: first error at call 3 cause dependency",
        "1 of 1 shard(s) reused",
        "│ state_consistency │ 15       │",
        "step1.tracking_number: no field 'tracking_number'",
        "report written to out/tutorial/report/report.html",
    ],
    "docs/how-to/audit-a-benchmark.md": [
        "wrote 2 rollouts to out/audit/bfcl-excerpt/store: 2 ok, 0 harness error(s)",
        "│ DeepSeek-V3-0324-FC │ 30 │ 9   │ state_consistency │",
        "mv: no path allowed in destination",
        "wrote 4 rollouts to out/audit/ts/store: 3 ok, 1 harness error(s)",
        "ConnectionError: Cellular service is not enabled",
    ],
    "docs/how-to/score-nightly-logs.md": [
        "wrote 40 rollouts to out/support/store/date=2026-11-28: 40 ok, 0 harness error(s)",
        "read 40 · scored 40 · rejected 0 · steps 191",
        "│ observed  │ support-model-b · v1.5 │ 20 │     0.850 † │     0.550 † │",
        "diff: out/support/runs/date=2026-11-28 (A) -> out/support/runs/date=2026-11-29 (B)",
        "│ 2026-11-29 │ support-model-b │ v1.5          │ 20       │ 0.7  │",
        "│ get_order       │ D            │ information  │              │ 4 │",
        "breach invalid_rate>0.1: invalid_rate B − A = +0.2500",
    ],
    "docs/how-to/score-logs-without-a-spec.md": [
        "draft written to out/own/draft/ (spec.toml, tools.json, initial_state.json): review it",
    ],
    "docs/how-to/score-mlflow-traces.md": [
        "mlflow serving at http://127.0.0.1:5000",
        "wrote 1 rollouts to out/mlflow/store: 1 ok, 0 harness error(s)",
        "mlflow: 1 trace(s): 7 value(s) written, 0 updated, 0 unchanged, 0 removed",
        "step 3: check P failed (cause precondition): order O5521 is shipped: only",
    ],
    "docs/how-to/score-phoenix-traces.md": [
        "phoenix serving at http://127.0.0.1:6006",
        "wrote 1 rollouts to out/phoenix/store: 1 ok, 0 harness error(s)",
        "phoenix: 1 trace(s): 7 value(s) written, 0 updated, 0 unchanged, 0 removed",
        "step 3: check P failed (cause precondition): order O5521 is shipped: only",
    ],
    "docs/how-to/run-on-a-cluster.md": [
        "s3 serving at http://127.0.0.1:5555",
        "wrote 400 rollouts over 40 tasks to s3://pexec-runs/store",
        "│ 400      │",
    ],
    "docs/how-to/guard-a-live-agent.md": [
        "get_order: False D information order_id='O5001' occurs in no earlier output or message",
        "authenticate: True {'user_id': 'U1001'}",
    ],
    "docs/how-to/change-a-spec-safely.md": [
        "wrote 40 rollouts to out/change/store: 40 ok, 0 harness error(s)",
        "would refuse 22 call(s): 21 in rollouts that succeeded anyway (probable false refusals), 11 that failed in",
        "against support: 11 newly refused, 0 refused before and let through now",
        "| refund_order | D information (grounded amount) | 2026-11-28-0016 | 7 | True | amount=80.0 occurs in no",
        "breach newly_refused>0: newly_refused = 11",
        "│ valid → invalid      │    11 │       11 │     3 │",
        "breach to_invalid>0: steps valid in A, invalid in B = 11 step(s)",
        "input, scoring core, settings and environments (observed) unchanged",
        "environment observed changed (observed+support@1.1.0+",
    ],
    "docs/how-to/add-a-log-format.md": [
        "s-104 True ['cancel_order']",
        "s-105 False ['track_shipment']",
    ],
    "docs/how-to/add-an-environment.md": [
        "library@1.0.0+78ad2e2c18b13bb3",
        "book_id='B9' occurs in no earlier output or message",
        "no copy of B2 left",
        "data must contain ['book_id'] properties",
        "4 get False information key='size' occurs in no earlier output or message",
    ],
    "docs/how-to/query-with-sql.md": [
        "│ state_consistency │",
        "invalid zip code ABCDE",
        "model,method,mean_calls,ter",
        "error: query stopped after 1 s (the --timeout)",
        "stopped, as asked",
        "pexec sql: the result was cut at 3 rows (the --max-rows)",
        "cut, as asked",
        "partial read: None",
    ],
}


class DocError(Exception):
    """A page whose examples cannot be told apart: a `not run` marker without a reason, or marking nothing."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason a block does not run here; None: it runs
    shown: str | None = None  # the output the page shows for it: the plain ``` block right after it, if any


_MARKER = re.compile(r"<!--\s*not run\b(.*?)-->", re.S)


def bash_blocks(text: str, page: str) -> list[Block]:
    """The ```bash blocks of `text` in order, each with the reason of its `not run` marker, if any."""
    blocks: list[Block] = []
    fence: str | None = None  # the opening fence of the block being read
    is_bash, is_output, start, body, reason = False, False, 0, [], None
    previous = ""  # the last non-blank line outside a block
    after_bash = False  # nothing but blank lines since a ```bash block closed
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            if stripped == fence:
                if is_bash:
                    blocks.append(Block(page, start, "\n".join(body) + "\n", reason))
                elif is_output:
                    blocks[-1] = replace(blocks[-1], shown="\n".join(body) + "\n")
                fence, body, previous, after_bash = None, [], "", is_bash
            else:
                body.append(line)
            continue
        marker = _MARKER.fullmatch(previous)
        opening = re.fullmatch(r"(`{3,})(\S*).*", stripped)
        if opening:
            is_output = after_bash and opening.group(2) in ("", "text")
            fence, start, is_bash = opening.group(1), number, opening.group(2) == "bash"
            reason = None
            if marker and not is_bash:
                raise DocError(f"{page}:{number}: a `not run` marker above a {opening.group(2) or 'plain'} block")
            if marker:
                reason = marker.group(1).removeprefix(":").strip()
                if not marker.group(1).startswith(":") or not reason:
                    raise DocError(f"{page}:{number}: `not run` needs a reason: <!-- not run: <why> -->")
        elif stripped:
            if marker:
                raise DocError(f"{page}:{number}: a `not run` marker above a line that is not a ```bash block")
            previous, after_bash = stripped, False
    if fence is not None:
        raise DocError(f"{page}:{start}: a code block that never ends")
    if _MARKER.fullmatch(previous):
        raise DocError(f"{page}: a `not run` marker at the end of the page")
    return blocks


def page_blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text()
    if page == "README.md":
        assert TOUR in text, f"README.md has no section {TOUR!r}"
        text = text.split(TOUR, 1)[1].split("\n## ", 1)[0]
    return bash_blocks(text, page)


# What `make test` passes down to its commands: a page's own `make` would then print "Entering directory" lines
# that a reader's shell never shows.
_MAKE_VARIABLES = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")


# The terminal the pages' outputs were printed in: the first hour's wider terminal, so that a reader pasting a page
# into a terminal that wide sees what it shows, tables and wrapped lines alike.
PAGE_COLUMNS = 120


def shell_env(ray_address: str = "", columns: int = PAGE_COLUMNS) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k not in _MAKE_VARIABLES},
        "RAY_ADDRESS": ray_address,  # a command that scores on Ray joins the suite's shared one: no Ray start each
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "COLUMNS": str(columns),  # the terminal the reader has
    }


def run(code: str, cwd: Path, ray_address: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=cwd, env=shell_env(ray_address),
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT)  # fmt: skip


# Printed by the page's shell before each block, so one shell's output splits back into the blocks' outputs.
_SEPARATOR = "@@pexec-doc-block {}@@"
_SEPARATED = re.compile(r"\n@@pexec-doc-block (\d+)@@\n")  # with the newlines it prints around itself


@dataclass
class ShellRun:
    """A page's runnable blocks run in order in one bash process, as a reader pastes them into one terminal:
    what each block printed (stdout and stderr as they interleave), and how the shell ended."""

    outputs: list[tuple[Block, str]]  # every block that started, with its output
    returncode: int

    @property
    def output(self) -> str:
        return "".join(out for _, out in self.outputs)


def run_in_one_shell(blocks: list[Block], cwd: Path, env: dict[str, str], timeout: float) -> ShellRun:
    """`bash -e -o pipefail` with every block in turn: a block that fails ends the shell (its EXIT traps run)."""
    script = "".join(f"printf '\\n%s\\n' '{_SEPARATOR.format(i)}'\n{b.code}" for i, b in enumerate(blocks))
    script += f"printf '\\n%s\\n' '{_SEPARATOR.format(len(blocks))}'\n"  # what follows is the EXIT traps' output
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip
    parts = _SEPARATED.split(done.stdout)  # [before, i, output, i, output, ...]
    outputs = [(blocks[int(i)], out) for i, out in zip(parts[1::2], parts[2::2], strict=True) if int(i) < len(blocks)]
    return ShellRun(outputs, done.returncode)


def _pattern(shown: str) -> re.Pattern[str]:
    """A line as shown on a page, as a pattern: `…` stands for whatever the page leaves out, a duration for any."""
    text = re.escape(shown.rstrip())
    text = text.replace(re.escape("…"), ".*")
    text = re.sub(r"\d+(?:\\\.\d+)?s(?=\b|$)", r"[0-9.]+s", text)
    text = re.sub(r"\d+/s\b", r"[0-9,]+/s", text)  # a progress line's rate
    text = re.sub(r"\d+:\d\d:\d\d", r"[0-9]+:[0-9][0-9]:[0-9][0-9]", text)  # and its clocks
    # A table row ending at a border shows the first columns: the printed row may go on.
    return re.compile(text + ".*" if shown.rstrip().endswith(("│", "┃")) else text)


def unshown_lines(shown: str, printed: str) -> list[str]:
    """The lines a page shows that its block did not print, in that order (each shown line matches a printed line
    after the previous one's; a shown `…` matches any text, a duration any duration)."""
    lines = [line.rstrip() for line in printed.splitlines()]
    at, missing = 0, []
    for want in (w for w in shown.splitlines() if w.strip()):
        pattern = _pattern(want)
        found = next((i for i in range(at, len(lines)) if pattern.fullmatch(lines[i])), None)
        if found is None:
            missing.append(want)
        else:
            at = found + 1
    return missing


_PROGRESS = re.compile(r"^scoring ━")  # the progress bar's last state: its rate and clocks are the machine's
# A table's drawing rather than its content: a border, a row continuing the one above (its first cell empty: a
# value's interval, a wrapped cell), a centred title.
_DRAWING = re.compile(r"^[\s┏┡└┌╭╰├┗━─┳╇┻┴┬┼╋┓┩┘┐╮╯┤│┃�]*$|^│\s+│|^\s{20,}\S")


def compared_lines(text: str) -> list[str]:
    """The lines of an output that a page must show: not blank, not the progress bar, not a table's drawing."""
    return [line.rstrip() for line in text.splitlines() if line.strip() and not _PROGRESS.match(line)
            and not _DRAWING.match(line)]  # fmt: skip


def output_differs(shown: str, printed: str) -> str | None:
    """None when the block printed exactly what the page shows, line for line (blank lines and the progress bar
    aside); else the difference. On the page a line `…` stands for any number of lines left out, a `…` inside a
    line for any text, a duration, rate or clock for any, and a table row ending at a border for its first
    columns."""
    wanted = compared_lines(shown)
    lines = compared_lines(printed)
    patterns = [None if w.strip() == "…" else _pattern(w) for w in wanted]

    @functools.cache
    def fits(i: int, j: int) -> bool:  # wanted[i:] matches lines[j:]
        if i == len(patterns):
            return j == len(lines)
        pattern = patterns[i]
        if pattern is None:
            return any(fits(i + 1, k) for k in range(j, len(lines) + 1))
        return j < len(lines) and pattern.fullmatch(lines[j]) is not None and fits(i + 1, j + 1)

    if fits(0, 0):
        return None
    return "\n".join(difflib.unified_diff(wanted, lines, "shown on the page", "printed", lineterm="", n=1))


TRACEBACK = "Traceback (most recent call last)"


def make_demo_run(wheres: list[Path]) -> None:
    """`make demo`'s store and run (same size, seed and shards; scored in-process) in the first of `wheres`, copied
    to the others: the pages show its numbers. The page that scores again gets the one made in place: a run moved
    to another folder is not reused (its manifest names its input by absolute path)."""
    first, *others = wheres
    done = run(
        "pexec synth shop --rollouts 4000 --tasks 250 --seed 0 --out out/demo/store\n"
        "pexec score out/demo/store --out out/demo/run --shard-mb 2 --inline\n",
        first,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the demo run could not be made:\n{done.stderr}")
    for where in others:
        shutil.copytree(first / "out" / "demo", where / "out" / "demo", symlinks=True)


def mirror_venv(real: Path, fake: Path) -> None:
    """`fake` as the environment `real`, every entry a link to real's, but its install stamps new: `make` then takes
    the environments as installed (a checkout's files may be newer than the stamps of the environment the suite
    runs from) and starts a server rather than reinstalling anything."""
    fake.mkdir()
    for entry in real.iterdir():
        if entry.name == ".installed-stamp":
            (fake / entry.name).touch()
        elif entry.name == "servers" and entry.is_dir():
            fake.joinpath("servers").mkdir()
            for server in entry.iterdir():
                mirror_venv(server, fake / "servers" / server.name)
        else:
            (fake / entry.name).symlink_to(entry)


def workspace(where: Path) -> Path:
    for name in SHARED:
        (where / name).symlink_to(ROOT / name)
    mirror_venv(Path(sys.prefix), where / ".venv")  # `source .venv/bin/activate`, as after `make install`
    return where


@dataclass
class PageRun:
    """What running a page's blocks in one shell gave."""

    shell: ShellRun | None = None
    seconds: float = 0.0
    error: BaseException | None = None


def run_page(page: str, where: Path, demo_run: Future[None] | None, ray_address: str) -> PageRun:
    result, started = PageRun(), time.monotonic()
    try:
        if demo_run is not None:
            demo_run.result()
        cwd = workspace(where)
        runnable = [b for b in page_blocks(page) if b.not_run is None]
        result.shell = run_in_one_shell(runnable, cwd, shell_env(ray_address), BLOCK_TIMEOUT * max(len(runnable), 1))
    except Exception as exc:  # reported by the page's own test, not as an error of the others
        result.error = exc
    result.seconds = time.monotonic() - started
    return result


def cost(page: str) -> int:
    """A page's expected share of the time: a command that scores on Ray (without --inline, a job) dominates."""
    code = [b.code for b in page_blocks(page) if b.not_run is None]
    ray = sum(len(re.findall(r"^pexec (?:run |score (?!.*--inline))", c, re.M)) for c in code)
    return 10 * ray + len(code)


def trace_servers(page: str) -> list[str]:
    """The trace servers a page starts (`make mlflow-server`), each from the environment `make servers` builds."""
    code = "".join(b.code for b in page_blocks(page) if b.not_run is None)
    return re.findall(r"^make (mlflow|phoenix)-server$", code, re.M)


@pytest.fixture(scope="module")
@starts("ray", "trace_server")
def page_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, PageRun]:
    """Every selected page's blocks, pages side by side, the costliest first: most of a page's time is a process
    importing or a job's Ray workers starting, so a few pages at once keep the file within about a minute. The
    commands that score on Ray join the suite's shared Ray rather than each starting one (seconds of CPU each)."""
    selected = {
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_page_examples_run"
    }
    # a page whose server's environment is not built is not run (its `make` would build it, printing more than
    # the page shows): its test says what to run
    selected = {p for p in selected if all(server_python_path(n).exists() for n in trace_servers(p))}
    address = shared_ray_address()
    with ThreadPoolExecutor(max_workers=PAGES_AT_ONCE) as pool:
        folders = {page: tmp_path_factory.mktemp("page") for page in selected}
        needing = sorted(selected & NEEDS_DEMO_RUN)  # README.md first: its tour scores the demo again
        demo = pool.submit(make_demo_run, [folders[p] for p in needing]) if needing else None
        futures = {
            page: pool.submit(
                run_page,
                page,
                folders[page],
                demo if page in NEEDS_DEMO_RUN else None,
                "" if page in OWN_RAY else address,
            )
            for page in sorted(selected, key=cost, reverse=True)
        }
        return {page: future.result() for page, future in futures.items()}


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page: str, page_runs: dict[str, PageRun]) -> None:
    for server in trace_servers(page):
        server_python(server)  # the environment `make servers` builds, or a one-line failure naming it
    runnable = [b for b in page_blocks(page) if b.not_run is None]
    expected = EXPECTED.get(page, [])
    assert bool(runnable) == bool(expected), f"{page}: runnable blocks and expected outputs go together"
    text = (ROOT / page).read_text()
    for want in expected:
        assert want in text, f"{page} does not show {want!r}, which its commands are expected to print"
    result = page_runs[page]
    print(f"{page}: {len(runnable)} block(s) in {result.seconds:.1f} s")  # shown with -s: where the time goes
    if result.error is not None:
        raise result.error
    check_shell(page, result.shell, result.seconds)
    for want in expected:
        assert want in result.shell.output, f"{page}: the commands did not print {want!r}"


def check_shell(page: str, shell: ShellRun | None, seconds: float, compare: bool = True) -> None:
    """The page's shell ran every block to the end, printed no traceback, and (`compare`) printed what the page
    shows after each block."""
    assert shell is not None
    runnable = [b for b in page_blocks(page) if b.not_run is None]
    last, output = shell.outputs[-1] if shell.outputs else (None, "")
    assert shell.returncode == 0, (
        f"{page}:{last.line if last else '?'}: exit {shell.returncode} ({seconds:.0f} s into the page)\n"
        f"{last.code if last else ''}\n--- output\n{output[-4000:]}"
    )
    assert [b for b, _ in shell.outputs] == runnable
    if os.environ.get("PEXEC_DOC_DUMP"):  # what each block printed: tests/rewrite_doc_outputs.py reads it
        dump = Path(os.environ["PEXEC_DOC_DUMP"]) / (page.replace("/", "__") + ".json")
        dump.write_text(json.dumps([{"line": b.line, "output": out} for b, out in shell.outputs]))
    for block, out in shell.outputs:
        assert TRACEBACK not in out, f"{page}:{block.line}: a traceback reached the reader\n{out[-4000:]}"
        if compare and block.shown is not None:
            difference = output_differs(block.shown, out)
            assert difference is None, f"{page}:{block.line}: the page does not show what it prints:\n{difference}"


def test_every_page_is_checked() -> None:
    """A new guide gets its examples run: every page of docs/how-to is in PAGES, with known outputs when it has
    runnable blocks; an expectation for a page that does not exist is a typo."""
    assert {"README.md", "docs/tutorial.md"} <= set(PAGES)
    assert len(PAGES) >= 9, PAGES  # the README, the tutorial and the seven guides
    assert set(EXPECTED) <= set(PAGES)


def test_markers_need_a_reason_and_a_block() -> None:
    good = "Text.\n\n<!-- not run: needs a Ray cluster -->\n```bash\npexec jobs\n```\n\n```bash\nls\n```\n"
    blocks = bash_blocks(good, "good.md")
    assert [(b.code, b.not_run) for b in blocks] == [("pexec jobs\n", "needs a Ray cluster"), ("ls\n", None)]
    assert blocks[0].line == 4
    for bad in (
        "<!-- not run -->\n```bash\nls\n```\n",  # no reason
        "<!-- not run:   -->\n```bash\nls\n```\n",  # an empty reason
        "<!-- not run: slow -->\nSome text.\n\n```bash\nls\n```\n",  # not right above the block
        "<!-- not run: slow -->\n```python\nprint()\n```\n",  # above a block that would not run anyway
        "```bash\nls\n",  # a block that never ends
    ):
        with pytest.raises(DocError):
            bash_blocks(bad, "bad.md")


def test_other_fences_are_not_run() -> None:
    text = "````markdown\n```bash\nrm -rf /\n```\n````\n\n```toml\n[a]\n```\n\n```bash\necho hi\n```\n"
    assert [b.code for b in bash_blocks(text, "fences.md")] == ["echo hi\n"]


def test_a_plain_block_right_after_a_command_is_its_output() -> None:
    text = "```bash\necho a\n```\n\n```\na\n```\n\nText.\n\n```bash\necho b\n```\n\nText.\n\n```\nb\n```\n"
    blocks = bash_blocks(text, "shown.md")
    assert [(b.code, b.shown) for b in blocks] == [("echo a\n", "a\n"), ("echo b\n", None)]


def test_shown_lines_must_be_printed_in_order() -> None:
    printed = "plan: 1 file(s)\nread 40 · scored 40 · 12.5s -> out/run\n│ a │ 1 │ 2 │ 3 │\n"
    assert unshown_lines("read 40 · scored 40 · 0.7s -> out/run\n│ a │ … │ 3 │\n", printed) == []
    assert unshown_lines("│ a │ 1 │ 2 │ 3 │\nplan: 1 file(s)\n", printed) == ["plan: 1 file(s)"]  # order counts
    assert unshown_lines("read 40 · scored 41 · 0.7s -> out/run\n", printed) == [
        "read 40 · scored 41 · 0.7s -> out/run"
    ]


def test_one_shell_runs_the_blocks_in_turn(tmp_path: Path) -> None:
    blocks = [Block("p.md", 1, "X=1\necho first\n", None), Block("p.md", 5, "echo $X >&2\nfalse\n", None),
              Block("p.md", 9, "echo never\n", None)]  # fmt: skip
    shell = run_in_one_shell(blocks, tmp_path, dict(os.environ), 30)
    assert shell.returncode == 1
    assert [(b.line, out) for b, out in shell.outputs] == [(1, "first\n"), (5, "1\n")]


# The first hour of a new user, played: a fresh checkout (a copy of the repository's files, the environment
# installed), `make demo`, then the README's tour and every guide and the tutorial, each in one shell with the
# servers it starts, in a terminal of 120 and of 80 columns. It fails on a traceback, on an exit 0 after zero
# rollouts were scored, on a line that does not fit the terminal, and (at 120 columns) on any line a page shows
# after a block that the block did not print; the tables the pages show are compared at the pages' own width
# above (test_page_examples_run), a narrower terminal draws them otherwise. It lives in this module so that no
# other page runner shares its servers' fixed ports at the same time. About 10 minutes on the 2-core machine.
FIRST_HOUR_COLUMNS = (120, 80)
_TABLE = re.compile(r"[│┃┏┗┡└┌╭╰━─]")
_ZERO_SCORED = re.compile(r"\bscored 0\b|\bwrote 0 rollouts\b")


def fresh_checkout(where: Path) -> Path:
    """The repository's tracked files as a fresh clone has them, and the environment `make install` made."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source, copy = ROOT / name, where / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # as git checks it out: a link (the package's specs/ is one)
            copy.symlink_to(os.readlink(source))
        elif source.is_file():  # a file deleted in the working tree is not part of what is tested
            shutil.copy2(source, copy)
    mirror_venv(Path(sys.prefix), where / ".venv")  # its stamps newer than the copied files: nothing reinstalls
    return where


@dataclass
class Hour:
    columns: int
    shells: dict[str, ShellRun]
    seconds: float


def play_first_hour(where: Path, columns: int) -> Hour:
    started = time.monotonic()
    checkout = fresh_checkout(where)
    env = shell_env("", columns)
    env["PYTHONPATH"] = str(checkout)  # the checkout's code, as an install from it runs
    env.pop("RAY_ADDRESS")  # every score starts its own Ray, as on the reader's machine
    demo = Block("Makefile", 0, "make demo\n", None)
    readme = [demo, *(b for b in page_blocks("README.md") if b.not_run is None)]
    sql = [b for b in page_blocks("docs/how-to/query-with-sql.md") if b.not_run is None]
    shells: dict[str, ShellRun] = {}

    def tour() -> None:  # the demo, then the pages that read its run, one after the other
        shells["README.md"] = run_in_one_shell(readme, checkout, env, BLOCK_TIMEOUT * len(readme))
        shells["docs/how-to/query-with-sql.md"] = run_in_one_shell(sql, checkout, env, BLOCK_TIMEOUT * len(sql))

    def page(name: str) -> None:
        blocks = [b for b in page_blocks(name) if b.not_run is None]
        if blocks:
            shells[name] = run_in_one_shell(blocks, checkout, env, BLOCK_TIMEOUT * len(blocks))

    others = sorted((p for p in PAGES if p not in NEEDS_DEMO_RUN), key=cost, reverse=True)
    with ThreadPoolExecutor(max_workers=PAGES_AT_ONCE) as pool:
        for future in [pool.submit(tour), *(pool.submit(page, p) for p in others)]:
            future.result()
    return Hour(columns, shells, time.monotonic() - started)


@pytest.fixture(scope="module", params=FIRST_HOUR_COLUMNS, ids=lambda c: f"{c}cols")
@starts("ray", "trace_server")
def first_hour(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Hour:
    hour = play_first_hour(tmp_path_factory.mktemp(f"checkout{request.param}"), request.param)
    print(f"first hour at {hour.columns} columns: {hour.seconds:.0f} s")
    return hour


def test_first_hour_runs_every_page_to_the_end(first_hour: Hour) -> None:
    assert set(first_hour.shells) >= {"README.md", "docs/tutorial.md"}
    for page, shell in first_hour.shells.items():
        last, output = shell.outputs[-1] if shell.outputs else (None, "")
        assert shell.returncode == 0, (
            f"{page}:{last.line if last else '?'} at {first_hour.columns} columns: exit {shell.returncode}\n"
            f"{last.code if last else ''}\n--- output\n{output[-4000:]}"
        )
        for block, out in shell.outputs:
            assert TRACEBACK not in out, f"{page}:{block.line}: a traceback reached the reader\n{out[-4000:]}"


def test_first_hour_never_goes_on_after_scoring_nothing(first_hour: Hour) -> None:
    """A block whose command scored or wrote zero rollouts was followed by the next: it exited 0."""
    for page, shell in first_hour.shells.items():
        went_on = shell.outputs if shell.returncode == 0 else shell.outputs[:-1]  # the last one that failed did not
        for block, out in went_on:
            assert not _ZERO_SCORED.search(out), f"{page}:{block.line}: exit 0 after zero rollouts\n{out[-2000:]}"


# Lines that are not pexec's human output and keep their length: a file a block shows (`cat`, `sed`, `diff` of a
# spec), what a reader's own script prints (`python - <<'PY'`), JSON (`--json`, `--format json`), `diff`'s lines of
# a file (`> `, `< `), an alert line (`breach …`: one line per breach, for grep and for the nightly job), and a link
# with its short label (a link cut in two no longer opens).
_FILE_COMMANDS = re.compile(r"^\s*(?:cat|sed|diff|head|tail|python -)(?=\s|$)")
_LINK = re.compile(r"^\s*\S{0,3}\s*https?://\S+$")


def _not_human(block: Block, line: str) -> bool:
    return (
        bool(_FILE_COMMANDS.match(block.code))
        or line.lstrip().startswith(("{", "[", "breach "))
        or line.startswith(("> ", "< "))
        or bool(_LINK.match(line))
    )


def test_first_hour_output_fits_the_terminal(first_hour: Hour) -> None:
    from rich.cells import cell_len

    wide = [
        f"{page}:{block.line}: {cell_len(line)} > {first_hour.columns}: {line[:100]}"
        for page, shell in first_hour.shells.items()
        for block, out in shell.outputs
        for line in out.splitlines()
        if cell_len(line) > first_hour.columns and not _not_human(block, line)
    ]
    assert not wide, "\n".join(wide[:40])


def test_first_hour_prints_what_the_pages_show(first_hour: Hour) -> None:
    """Every line a page shows after a block, but the tables', in the pages' own terminal width."""
    if first_hour.columns != PAGE_COLUMNS:
        pytest.skip(f"the pages show what a terminal of {PAGE_COLUMNS} columns prints")
    differences = []
    for page, shell in first_hour.shells.items():
        for block, out in shell.outputs:
            if block.shown is None:
                continue
            shown = "\n".join(line for line in block.shown.splitlines() if not _TABLE.search(line))
            missing = unshown_lines(shown, out)
            if missing:
                differences.append(f"{page}:{block.line}:\n" + "\n".join(missing) + f"\n--- printed\n{out[-2000:]}")
    assert not differences, "\n\n".join(differences)


def test_a_page_shows_all_a_block_prints_or_says_what_it_leaves_out() -> None:
    rows = "│ a │ 1 │\n│ b │ 2 │\n│ c │ 3 │\n"
    printed = "plan: 1 file(s)\nscoring ━━━ 1/1 shards · 5/s\nread 40 · 12.5s -> out/run\n" + rows
    assert output_differs("plan: 1 file(s)\nread 40 · 0.7s -> out/run\n" + rows, printed) is None
    assert output_differs("plan: 1 file(s)\n…\n│ c │ 3 │\n", printed) is None  # `…`: lines left out, said so
    assert output_differs("plan: …\n…\n", printed) is None
    assert output_differs("plan: 1 file(s)\nread 40 · 0.7s -> out/run\n│ a │ 1 │\n", printed) is not None  # 1 row of 3
    assert output_differs("read 40 · 0.7s -> out/run\n…\n", printed) is not None  # the first line left out, unsaid
