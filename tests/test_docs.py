"""The documentation site (docs/, mkdocs.yml) and the README are tested against the code: every command has a
reference entry, every `pexec …` a page shows uses real commands and options, the generated reference blocks are
current, the spec example compiles, the benchmark blocks have the bench format, links and anchors resolve, and
every citation of a docs page in pipeline/ and tests/ names a page and a heading that exist.

Each check is a function that returns what is wrong, so that test_the_checks_fail_on_broken_pages can show every
one of them failing. `make docs`, which `make test` runs first, builds the site with `mkdocs build --strict` on
top of these (every link and anchor between pages, every page in the nav).
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from pipeline.apps.cli import reference
from pipeline.apps.jobs.definition import FIELDS, NOT_IN_JOB_FILES, load_job
from pipeline.apps.perf import figures
from pipeline.apps.perf.registry import BENCHES
from pipeline.core import metric_catalogue
from pipeline.core.errors import JobFileError
from pipeline.core.run_schema import markdown, tables
from pipeline.envs.spec.loader import SpecError, load_spec

pytestmark = pytest.mark.docs
ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
REFERENCE = DOCS / "reference"

# "synth", "guard serve" (a sub-app's command), "" (pexec itself) -> the command
COMMANDS = {entry.words: entry.command for entry in reference.commands()}


def pages() -> dict[Path, str]:
    """Every page of the site, and the README."""
    found = sorted(DOCS.rglob("*.md"))
    return {p: p.read_text(encoding="utf-8") for p in [*found, README]}


def outside_code(text: str) -> str:
    """The text with its fenced code blocks blanked out (headings and links in code are not the page's)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# --- commands --------------------------------------------------------------------------------------------------


def entry_problems(cli_page: str) -> list[str]:
    """Every command and group of the app has its generated entry on the CLI page."""
    have = reference.blocks(cli_page)
    missing = [words for words in COMMANDS if f"cli {words}".strip() not in have]
    return [f"no reference entry for `{' '.join(['pexec', *words.split()])}`" for words in missing]


def invocations(text: str) -> list[list[str]]:
    """The words of every `pexec …` line in a ```bash block (a line ending in `\\` continues)."""
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("pexec "):
                found.append(shlex.split(line, comments=True))
    return found


def invocation_problems(text: str, where: str) -> list[str]:
    """Each `pexec` line names a real command, and every `--option` it gives (before a `--` that hands the rest to
    another program) is one of that command's."""
    problems = []
    for words in invocations(text):
        if len(words) < 2 or words[1].startswith("-"):
            name = ""  # `pexec --version`
        else:  # "guard serve" before "guard": a sub-app's command, not its group
            name = " ".join(words[1:3]) if " ".join(words[1:3]) in COMMANDS else words[1]
        if name not in COMMANDS:
            problems.append(f"{where}: `{' '.join(words)}` uses unknown command {name!r}")
            continue
        command = COMMANDS[name]
        options = {"--help"} | {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        arguments = words[1 + len(name.split()) :]
        for word in arguments[: arguments.index("--") if "--" in arguments else None]:
            if word.startswith("--") and word.split("=")[0] not in options:
                problems.append(f"{where}: `pexec {name}` has no option {word}")
    return problems


def test_every_command_has_a_reference_entry():
    assert entry_problems((REFERENCE / "cli.md").read_text(encoding="utf-8")) == []


def test_every_pexec_line_of_the_pages_and_the_readme_uses_real_commands_and_options():
    everything = pages()
    assert sum(len(invocations(text)) for text in everything.values()) >= 40
    problems = [p for path, text in everything.items() for p in invocation_problems(text, str(path.relative_to(ROOT)))]
    assert problems == []


# --- generated reference -----------------------------------------------------------------------------------------


def test_the_generated_reference_blocks_are_current():
    """Regenerate with `python -m pipeline.apps.cli.reference` (or `make reference`)."""
    assert reference.problems(ROOT) == []


def test_the_run_tables_are_the_schema_and_the_metrics_table_is_the_catalogue():
    schema = reference.blocks((REFERENCE / "run-folder.md").read_text(encoding="utf-8"))["schema"]
    assert schema == markdown()
    assert all(f"**`{table.path}`**" in schema for table in tables())
    catalogue = reference.blocks((REFERENCE / "metrics.md").read_text(encoding="utf-8"))["metrics"]
    assert catalogue == metric_catalogue.markdown()
    assert all(f"`{m.name}`" in catalogue for m in metric_catalogue.METRICS)


def test_the_spec_example_compiles(tmp_path):
    example = spec_example((REFERENCE / "environments.md").read_text(encoding="utf-8"))
    spec = compile_spec(example, tmp_path)
    assert [e.op for e in spec.tools["cancel_order"].effects] == ["set", "set", "append", "delete"]


def spec_example(page: str) -> str:
    return next(b for b in re.findall(r"^```toml\n(.*?)^```", page, re.S | re.M) if "[tool.cancel_order]" in b)


def compile_spec(example: str, folder: Path):
    """The example as the `spec.toml` of a folder with the shop spec's tools and initial state."""
    shop = ROOT / "specs" / "shop"
    (folder / "spec.toml").write_text(example)
    for name in ("tools.json", "initial_state.json"):
        shutil.copy(shop / name, folder / name)
    return load_spec(folder)


def test_a_job_file_may_hold_every_documented_field(tmp_path):
    """The job fields of docs/reference/jobs.md are what the loader accepts: a job that sets every one loads, and
    each value reaches the settings it sets."""
    values = {
        "": {"name": "j", "description": "d", "input": "in", "output": "out/date={date}", "env": "shop",
             "spec": "shop", "spec_dirs": ["specs"], "policy": "strict", "address": "ray://h:10001", "shard_mb": 4,
             "num_cpus": 1, "endpoint_url": "http://127.0.0.1:5555", "format": "canonical",
             "options": {"max_line_bytes": "1000"}, "labels": {"team": "a"}, "inline": True,
             "lease_stale_after": 30, "checks": ["precondition", "schema"], "storage_options": {"anon": True},
             "allow_empty": True},
        "metrics": {"by": ["model"], "bootstrap": 50, "seed": 1, "method": "poisson", "max_k": 3,
                    "harness_errors": "fail", "pool": {"all": ["shop", "observed"]}, "partial": True,
                    "strict_replay": True},
        "synth": {"spec": "shop", "rollouts": 10, "tasks": 2, "seed": 0},
        "submit": {"runtime": "image", "python": "python3"},
        "report": {"out": "r/{date}", "by": ["model"], "compare": ["method=a", "method=b"], "k": [1, 2],
                   "within": "model", "overwrite": True, "sensitivity": True, "figures": False},
        "diff": {"against": "previous", "by": ["model"], "fail_on": ["ter<-0.02"], "look_back_days": 3},
    }  # fmt: skip
    assert {(f.table, k) for f in FIELDS for k in f.keys} == {(t, k) for t, kv in values.items() for k in kv}

    def toml(value: object) -> str:
        if isinstance(value, dict):
            return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
        return repr(value).replace("True", "true").replace("False", "false").replace("'", '"')

    lines = [f"{k} = {toml(v)}" for k, v in values[""].items()]
    for table in (t for t in values if t):
        lines += [f"[{table}]", *(f"{k} = {toml(v)}" for k, v in values[table].items())]
    (tmp_path / "job.toml").write_text("\n".join(lines) + "\n")
    job = load_job(tmp_path / "job.toml", "2026-11-29")
    assert job.output == "out/date=2026-11-29" and job.report.within == "model" and job.diff.fail_on == ("ter<-0.02",)
    s = job.scoring
    assert (s.env, s.spec, s.spec_dirs, s.policy, s.address, s.shard_bytes, s.num_cpus, s.executor) == (
        "shop", "shop", ("specs",), "strict", "ray://h:10001", 4 * 2**20, 1, "inline"
    )  # fmt: skip
    assert (s.lease_stale_after, s.checks) == (30, ("schema", "precondition"))  # the checks' canonical order
    assert s.storage_options == {"anon": True, "endpoint_url": "http://127.0.0.1:5555"}
    assert s.labels == {"team": "a"} and s.options == {"max_line_bytes": "1000"} and s.allow_empty
    m = job.metrics
    assert (m.by, m.bootstrap.B, m.bootstrap.seed, m.bootstrap.method, m.max_k) == (("model",), 50, 1, "poisson", 3)
    assert m.population.pools == (("all", ("shop", "observed")),) and m.population.strict_replay
    assert job.partial and job.report.sensitivity and job.report.by == ("model",) and not job.report.figures


def test_every_score_option_has_a_job_file_key():
    """`pexec score`'s options, read from the command, are the job file's top-level keys of the same names, but
    the documented exclusions; and the jobs reference names each key's option."""
    options = {p.name for p in COMMANDS["score"].params if p.param_type_name == "option"}
    keys = {k for f in FIELDS if f.table == "" for k in f.keys}
    assert options - keys == set(NOT_IN_JOB_FILES)
    assert not set(NOT_IN_JOB_FILES) & keys
    for key in options - set(NOT_IN_JOB_FILES):
        assert reference.job_option("", key).name == key


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('policy = "lenient"', "job.toml: policy is code or strict, got 'lenient'"),
        ("shard_mb = 0", "job.toml: shard_mb takes a size > 0"),
        ("shard_mb = 5000", "job.toml: shard_mb takes a size > 0 and at most 4,096 MiB, got 5000"),
        ('shard_mb = "4"', "job.toml: shard_mb takes a size > 0"),
        ("num_cpus = 0", "job.toml: num_cpus is a whole number 1 to 1,024, got 0"),
        ("lease_stale_after = 0.5", "job.toml: lease_stale_after is a number 1 to 86400, got 0.5"),
        ('checks = ["schema", "x"]', "job.toml: checks: checks are a comma-separated subset"),
        ('checks = "schema"', "job.toml: checks is a list of names, got 'schema'"),
        ("inline = 1", "job.toml: inline is true or false, got 1"),
        ('storage_options = { secret = "s" }', "job.toml: storage_options: secret cannot be set in a job file"),
        ('storage_options = { key = "k", anon = true }', "job.toml: storage_options: key cannot be set"),
        ('[metrics]\nbootstrap = "50"', "job.toml [metrics]: bootstrap B must be 1 to 10,000, got '50'"),
        ("[metrics]\nmax_k = 1001", "job.toml [metrics]: max_k is a whole number 0 to 1,000, got 1001"),
        ('[metrics]\nby = "model"', "job.toml [metrics]: by is a list of names, got 'model'"),
        ('[metrics]\npool = { p = "shop" }', "job.toml [metrics]: pool is a list of names, got 'shop'"),
        ("[report]\nby = [1]", "job.toml [report]: by is a list of names, got [1]"),
        ('[report]\nsensitivity = "yes"', "job.toml [report]: sensitivity is true or false"),
    ],
)
def test_a_job_value_that_does_not_fit_fails_naming_its_file_table_and_key(tmp_path, line, message):
    (tmp_path / "job.toml").write_text(f'name = "j"\ninput = "in"\noutput = "out"\n{line}\n')
    with pytest.raises(JobFileError) as failed:
        load_job(tmp_path / "job.toml")
    assert str(failed.value).startswith(f"{tmp_path}/{message}")


def option_problems(page: str) -> list[str]:
    """Every `--option` key of the generated table (format | key | default | meaning) has a meaning."""
    rows = reference.blocks(page).get("options", "").splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return [f"--option {c[1]} of {c[0]} has no meaning" for c in cells if len(c) < 4 or not c[3]]


def test_every_option_key_of_a_log_format_is_explained():
    page = (REFERENCE / "log-formats.md").read_text(encoding="utf-8")
    assert "`error_prefix`" in reference.blocks(page)["options"]
    assert option_problems(page) == []


def test_the_job_example_loads(tmp_path):
    page = (REFERENCE / "jobs.md").read_text(encoding="utf-8")
    (tmp_path / "job.toml").write_text(re.search(r"^```toml\n(.*?)^```", page, re.S | re.M).group(1))
    job = load_job(tmp_path / "job.toml", "2026-11-29")
    assert job.output.endswith("date=2026-11-29") and job.report is not None and job.diff.fail_on == ("ter<-0.02",)


# --- benchmarks --------------------------------------------------------------------------------------------------


def bench_problems(page: str, names: Iterable[str]) -> list[str]:
    """One block per bench, as `pexec bench NAME --readme FILE` writes it (its shape, not its numbers): a caption
    ending with the day of the measurement, then figure | runs | project | baseline | ratio rows; and no date in
    the page outside the blocks (a figure's date lives in its caption only)."""
    blocks = figures.blocks(page)
    problems = [f"bench {n}: no block" for n in sorted(set(names) - set(blocks))]
    problems += [f"bench {n}: a block no bench writes" for n in sorted(set(blocks) - set(names))]
    for name, block in blocks.items():
        lines = block.splitlines()
        caption, blank, header, rule, *rows = lines + [""] * (4 - len(lines))
        if not re.fullmatch(r"_.+; measured \d{4}-\d{2}-\d{2}_", caption) or blank:
            problems.append(f"bench {name}: caption {caption!r} is not _…; measured YYYY-MM-DD_")
        if header != "| " + " | ".join(figures.HEADER) + " |" or rule != "|" + "---|" * 5 or not rows:
            problems.append(f"bench {name}: not the bench table")
        for row in rows:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
            if not (len(cells) == 5 and cells[1].isdigit()):
                problems.append(f"bench {name}: row {row!r}")
            elif not (cells[3].startswith("none") or cells[3].endswith(")")):  # a baseline names itself or says why not
                problems.append(f"bench {name}: baseline cell {cells[3]!r}")
            elif not (cells[4] == "–" or cells[4].endswith("×")):
                problems.append(f"bench {name}: ratio cell {cells[4]!r}")
    prose = re.sub(r"<!-- bench:start (\w+) -->\n.*?<!-- bench:end \1 -->", "", page, flags=re.S)
    problems += [f"a date outside the bench blocks: {d}" for d in re.findall(r"\b20\d\d-\d\d-\d\d\b", prose)]
    return problems


def test_the_benchmark_page_has_one_block_per_bench_in_the_bench_format():
    assert bench_problems((REFERENCE / "benchmarks.md").read_text(encoding="utf-8"), BENCHES) == []


def test_no_other_page_holds_a_benchmark_block():
    """The figures have one home, docs/reference/benchmarks.md (`make bench` writes there)."""
    holding = [p for p, t in pages().items() if p != REFERENCE / "benchmarks.md" and figures.blocks(t)]
    assert holding == []


# --- links and citations -----------------------------------------------------------------------------------------


def headings(page: str) -> dict[str, str]:
    """heading text -> its anchor, as mkdocs makes them (an explicit `{#id}` wins)."""
    found = {}
    for line in outside_code(page).splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*(?:\{#([\w-]+)\})?\s*#*\s*$", line):
            text = re.sub(r"[`*]", "", m[1]).strip()
            found[text] = m[2] or slugify(text, "-")
    return found


def anchors(page: Path) -> set[str]:
    return set(headings(page.read_text(encoding="utf-8")).values())


def link_problems(path: Path, text: str) -> list[str]:
    """Every relative link of a page leads to a file that exists and, into a page of the site, to a heading of it
    (links within the README to its own headings follow GitHub's anchors and are not checked)."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", outside_code(text)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            problems.append(f"{path.name}: link {target!r}: no such file")
        elif anchor and where.suffix == ".md" and where.is_relative_to(DOCS) and anchor not in anchors(where):
            problems.append(f"{path.name}: link {target!r}: no such heading in {where.name}")
    return problems


def test_every_link_of_the_pages_and_the_readme_resolves():
    assert [p for path, text in pages().items() for p in link_problems(path, text)] == []


# A citation: docs/<path>.md, optionally followed by one or more quoted headings: `, "A"`, ` and "B"`, ` ("A")`.
CITATION = re.compile(r"\bdocs/((?:[\w-]+/)*[\w-]+\.md)((?:(?:\s*,\s*|\s+and\s+|\s*\(\s*)\"[^\"]+\"\)?)*)")


def citation_problems(files: dict[Path, str]) -> list[str]:
    """Each citation names a page that exists and headings it has. Comments and docstrings wrap, so a citation may
    run over a line break and the next line's comment marker."""
    problems = []
    for path, text in files.items():
        flat = re.sub(r"\s*\n\s*(?:#+|--|//)?\s*", " ", text)
        for m in CITATION.finditer(flat):
            page = DOCS / m[1]
            if not page.is_file():
                problems.append(f"{path.name}: cites docs/{m[1]}, which does not exist")
                continue
            have = headings(page.read_text(encoding="utf-8"))
            for heading in re.findall(r"\"([^\"]+)\"", m[2]):
                if heading not in have:
                    problems.append(f'{path.name}: cites docs/{m[1]}, "{heading}", which has no such heading')
    return problems


def test_every_citation_of_a_docs_page_in_the_code_names_a_page_and_heading_that_exist():
    files = {p: p.read_text(encoding="utf-8") for folder in ("pipeline", "tests") for p in (ROOT / folder).rglob("*")
             if p.suffix in {".py", ".sql", ".md", ".toml", ".html"} and p.is_file()}  # fmt: skip
    cited = [m[1] for text in files.values() for m in CITATION.finditer(text)]
    assert len(cited) >= 30  # the code does cite the docs: a pattern that matched nothing would prove nothing
    assert citation_problems(files) == []


# --- the checks can fail -----------------------------------------------------------------------------------------


def test_the_checks_fail_on_broken_pages(tmp_path):
    """One broken case per kind of check, each of which the checks above must report."""
    cli = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    without_synth = re.sub(
        r"<!-- generated:start cli synth -->.*?<!-- generated:end cli synth -->", "", cli, flags=re.S
    )
    assert entry_problems(without_synth) == ["no reference entry for `pexec synth`"]

    page = "```bash\npexec scoer data --out run\npexec score data --out run \\\n  --shards 4\n```\n"
    assert invocation_problems(page, "p") == [
        "p: `pexec scoer data --out run` uses unknown command 'scoer'",
        "p: `pexec score` has no option --shards",
    ]

    shutil.copytree(DOCS, tmp_path / "docs")
    metrics = tmp_path / "docs" / "reference" / "metrics.md"
    metrics.write_text(metrics.read_text().replace("| TER | `ter` |", "| TER | `ter_total` |"))
    limits = tmp_path / "docs" / "reference" / "limits.md"
    limits.write_text(re.sub(r"<!-- generated:start limits -->.*?<!-- generated:end limits -->", "", limits.read_text(),
                             flags=re.S))  # fmt: skip
    assert sorted(reference.problems(tmp_path)) == [
        "docs/reference/limits.md: no block 'limits'",
        "docs/reference/metrics.md: block 'metrics' is stale",
    ]

    options = (REFERENCE / "log-formats.md").read_text(encoding="utf-8")
    options = re.sub(r"(\| `inspect` \| `scorer` \| [^|]*\|)[^|]*\|", r"\1 |", options)
    assert option_problems(options) == ["--option `scorer` of `inspect` has no meaning"]

    with pytest.raises(SpecError, match=r"unknown function '__import__'"):
        compile_spec(spec_example((REFERENCE / "environments.md").read_text()).replace("has(", "__import__("), tmp_path)

    bench = "<!-- bench:start replay -->\n_no date_\n\n| figure |\n<!-- bench:end replay -->\nSince 2026-12-01.\n"
    assert bench_problems(bench, ["replay", "tau"]) == [
        "bench tau: no block",
        "bench replay: caption '_no date_' is not _…; measured YYYY-MM-DD_",
        "bench replay: not the bench table",
        "a date outside the bench blocks: 2026-12-01",
    ]

    linking = "[a](reference/nope.md) [b](reference/cli.md#no-such-entry) [c](reference/cli.md#pexec-score)\n"
    assert link_problems(DOCS / "index.md", linking) == [
        "index.md: link 'reference/nope.md': no such file",
        "index.md: link 'reference/cli.md#no-such-entry': no such heading in cli.md",
    ]

    docs = "docs/"  # split, so that this file's own text cites nothing
    code = (
        f'"""Bootstrap ({docs}explanation/intervals.md, "Small\n    samples"), {docs}explanation/nowhere.md and\n'
        f'{docs}explanation/intervals.md, "Small samples" and "Big samples"."""\n'
    )
    assert citation_problems({Path("x.py"): code}) == [
        f"x.py: cites {docs}explanation/nowhere.md, which does not exist",
        f'x.py: cites {docs}explanation/intervals.md, "Big samples", which has no such heading',
    ]
