"""The shell examples of the docs run as written.

Every ```bash block of the tutorial, of each how-to guide and of the README's tour runs, in order per page, from
the root of a temporary workspace that holds what the pages need (the repository's `specs/`, `jobs/`, `tests/`
and `infra/`, and `.venv` pointing at this interpreter's environment), with `pexec` from this environment on
PATH. Each block must exit 0, and a few known outputs per page must be printed — and shown on the page, so the
page does not promise what the commands no longer print.

A block that cannot run here (a Ray cluster, cloud credentials, a server that runs until Ctrl-C, a package
install) carries `<!-- not run: <why> -->` on the line right above it; the reason is required.

The README's tour and the SQL guide start from the run `make demo` writes; the workspace gets a smaller one made
the same way (same seed and shard size, scored in-process), so their commands run unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import shared_ray_address, starts

pytestmark = pytest.mark.docs
ROOT = Path(__file__).resolve().parents[1]
TOUR = "## A five-minute tour"  # the README's section whose blocks run; the rest of the README is not a walk-through
GUIDES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs/how-to").glob("*.md"))
PAGES = ["README.md", "docs/tutorial.md", *GUIDES]
SHARED = ("specs", "jobs", "tests", "infra")  # what the pages read from the repository (never written)
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
        "│ observed  │ support-model-b · v1.5 │ 20 │     9 │",
        "diff: out/support/runs/date=2026-11-28 (A) -> out/support/runs/date=2026-11-29 (B)",
        "│ 2026-11-29 │ support-model-b │ v1.5          │ 20       │ 0.7  │",
        "│ get_order       │ D            │ information  │              │ 4 │",
        "breach invalid_rate>0.1: invalid_rate B − A = +0.2500",
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
        "│ r0000008   │ 5    │ update_address │ precondition │ invalid zip code ABCDE",
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


_MARKER = re.compile(r"<!--\s*not run\b(.*?)-->", re.S)


def bash_blocks(text: str, page: str) -> list[Block]:
    """The ```bash blocks of `text` in order, each with the reason of its `not run` marker, if any."""
    blocks: list[Block] = []
    fence: str | None = None  # the opening fence of the block being read
    is_bash, start, body, reason = False, 0, [], None
    previous = ""  # the last non-blank line outside a block
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            if stripped == fence:
                if is_bash:
                    blocks.append(Block(page, start, "\n".join(body) + "\n", reason))
                fence, body, previous = None, [], ""
            else:
                body.append(line)
            continue
        marker = _MARKER.fullmatch(previous)
        opening = re.fullmatch(r"(`{3,})(\S*).*", stripped)
        if opening:
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
            previous = stripped
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


def run(code: str, cwd: Path, ray_address: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_address,  # a command that scores on Ray joins the suite's shared one: no Ray start each
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "COLUMNS": "200",  # tables as the pages show them, not wrapped at 80
    }
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT)  # fmt: skip


def make_demo_run(out: Path) -> Path:
    """`make demo`'s store and run, at a tenth of the size (same seed, same shards, scored in-process)."""
    done = run(
        "pexec synth shop --rollouts 400 --tasks 40 --seed 0 --out out/demo/store\n"
        "pexec score out/demo/store --out out/demo/run --shard-mb 2 --inline\n",
        out,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the demo run could not be made:\n{done.stderr}")
    return out / "out" / "demo"


def workspace(where: Path, demo_run: Path | None) -> Path:
    for name in SHARED:
        (where / name).symlink_to(ROOT / name)
    (where / ".venv").symlink_to(Path(sys.prefix))  # `source .venv/bin/activate`, as after `make install`
    if demo_run is not None:
        shutil.copytree(demo_run, where / "out" / "demo", symlinks=True)
    return where


@dataclass
class PageRun:
    """What running a page's blocks in order gave: every block's result up to the first that failed."""

    done: list[tuple[Block, subprocess.CompletedProcess[str]]]
    seconds: float = 0.0
    error: BaseException | None = None


def run_page(page: str, where: Path, demo_run: Future[Path] | None, ray_address: str) -> PageRun:
    result, started = PageRun([]), time.monotonic()
    try:
        cwd = workspace(where, demo_run.result() if demo_run is not None else None)
        for block in page_blocks(page):
            if block.not_run is None:
                result.done.append((block, run(block.code, cwd, ray_address)))
                if result.done[-1][1].returncode != 0:
                    break
    except Exception as exc:  # reported by the page's own test, not as an error of the others
        result.error = exc
    result.seconds = time.monotonic() - started
    return result


def cost(page: str) -> int:
    """A page's expected share of the time: a command that scores on Ray (without --inline, a job) dominates."""
    code = [b.code for b in page_blocks(page) if b.not_run is None]
    ray = sum(len(re.findall(r"^pexec (?:run |score (?!.*--inline))", c, re.M)) for c in code)
    return 10 * ray + len(code)


@pytest.fixture(scope="module")
@starts("ray")
def page_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, PageRun]:
    """Every selected page's blocks, pages side by side, the costliest first: most of a page's time is a process
    importing or a job's Ray workers starting, so a few pages at once keep the file within about a minute. The
    commands that score on Ray join the suite's shared Ray rather than each starting one (seconds of CPU each)."""
    selected = {
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_page_examples_run"
    }
    address = shared_ray_address()
    with ThreadPoolExecutor(max_workers=PAGES_AT_ONCE) as pool:
        demo = pool.submit(make_demo_run, tmp_path_factory.mktemp("demo")) if selected & NEEDS_DEMO_RUN else None
        futures = {
            page: pool.submit(
                run_page, page, tmp_path_factory.mktemp("page"), demo if page in NEEDS_DEMO_RUN else None, address
            )
            for page in sorted(selected, key=cost, reverse=True)
        }
        return {page: future.result() for page, future in futures.items()}


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page: str, page_runs: dict[str, PageRun]) -> None:
    runnable = [b for b in page_blocks(page) if b.not_run is None]
    expected = EXPECTED.get(page, [])
    assert bool(runnable) == bool(expected), f"{page}: runnable blocks and expected outputs go together"
    text = (ROOT / page).read_text()
    for want in expected:
        assert want in text, f"{page} does not show {want!r}, which its commands are expected to print"
    result = page_runs[page]
    print(f"{page}: {len(result.done)} block(s) in {result.seconds:.1f} s")  # shown with -s: where the time goes
    if result.error is not None:
        raise result.error
    for block, done in result.done:
        assert done.returncode == 0, (
            f"{page}:{block.line}: exit {done.returncode} ({result.seconds:.0f} s into the page)\n{block.code}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )
    assert len(result.done) == len(runnable)
    output = "\n".join(done.stdout + done.stderr for _, done in result.done)
    for want in expected:
        assert want in output, f"{page}: the commands did not print {want!r}"


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
