"""The generated parts of the reference pages (docs/reference/*.md), written from the code that declares them:
every command and option (from the Typer app object, nothing else of the command line), the run's tables, the
metric catalogue, the job fields, each log format's `--option` keys, the built-in environments and the limits;
and of the guides that add a plug-in (docs/how-to/add-a-log-format.md, add-an-environment.md), every member of
its kind's class with its signature and docstring.

Each part is a block between `<!-- generated:start NAME -->` and `<!-- generated:end NAME -->` in a committed
page, with hand-written text around it. `python -m pipeline.apps.cli.reference` rewrites every block in place;
`--check` only lists the stale ones (exit 1), and tests/test_docs.py fails on any.

Committed pages rather than pages generated at build time (an mkdocs hook): the benchmark blocks
(docs/reference/benchmarks.md) are measurements no build can redo, so generated text is committed anyway and one
mechanism serves every block; a page reads the same in a checkout, on GitHub and on the site; the doc tests read
exactly what is published; and `make docs` stays a few seconds without importing pexec or Ray.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import typer.main
from typer._click import Command, Context, Parameter
from typer.core import TyperArgument, TyperOption
from typer.core import TyperGroup as Group

from pipeline.apps.cli import app
from pipeline.core.plugins import declared

DOCS = Path("docs") / "reference"
GUIDES = Path("docs") / "how-to"
BLOCK = re.compile(r"<!-- generated:start (.+?) -->\n(.*?)<!-- generated:end \1 -->", re.S)


@dataclass(frozen=True)
class Entry:
    """One command of the app, by its words after `pexec` ("" for `pexec` itself, "guard serve" for a
    sub-app's command)."""

    words: str
    command: Command
    context: Context


def commands() -> Iterator[Entry]:
    """Every command and group of the app, depth first, in the order the app registers them."""

    def walk(command: Command, words: str, parent: Context | None) -> Iterator[Entry]:
        context = Context(command, info_name=words.split()[-1] if words else "pexec", parent=parent)
        yield Entry(words, command, context)
        if isinstance(command, Group):
            for name, sub in command.commands.items():
                yield from walk(sub, f"{words} {name}".strip(), context)

    yield from walk(typer.main.get_command(app), "", None)


# What a value looks like, by the kind Typer shows for it ("<int range>", "<list[str]>", …).
_KINDS = {
    "str": "TEXT",
    "int": "INTEGER",
    "float": "NUMBER",
    "path": "PATH",
    "list[str]": "TEXT",
    "str,str": "TEXT TEXT",
}


def _kind(param: TyperOption | TyperArgument, context: Context) -> str:
    shown = param.display_type(context).strip("<>").removesuffix(" range")
    return _KINDS.get(shown, shown.upper())


def _value(param: Parameter, context: Context) -> str:
    """The value an option or argument takes: its kind, its range, whether it repeats; `flag` for a switch."""
    if getattr(param, "is_flag", False):
        return "flag"
    assert isinstance(param, TyperOption | TyperArgument), "every pexec command is declared through typer"
    kind = _kind(param, context)
    if param.min is not None and param.max is not None:
        kind += f" {param.min}–{param.max}"
    elif param.min is not None:
        kind += f" ≥ {param.min}"
    if param.multiple:
        kind += ", repeatable"
    elif param.nargs == -1:
        kind += " …"
    return kind


def _default(param: Parameter) -> str:
    if param.required:
        return "required"
    value = param.default
    if value is None or value is False or value == []:
        return "–"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _name(param: Parameter) -> str:
    """`--out` for an option, `STORE` for an argument (`SOURCES…` when it takes several)."""
    if param.param_type_name == "argument":
        name = param.name.upper()
        return name + ("…" if param.nargs == -1 else "")
    return ", ".join(param.opts + param.secondary_opts)


def _prose(text: str) -> str:
    """Text as one line of Markdown: outside code spans `<` before a letter (as in METRIC<NUMBER) written as an
    entity so that no renderer takes it for a tag."""
    pieces = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else re.sub(r"<(?=[A-Za-z])", "&lt;", p) for i, p in enumerate(pieces))


def _cell(text: str) -> str:
    """Text as one Markdown table cell: one line, `|` escaped, `<` as `_prose` writes it."""
    return _prose(text.replace("|", "\\|"))


def _number(x: float) -> str:
    """1e-09 as 1e-9; other numbers as `g` writes them."""
    return re.sub(r"e([-+])0*(\d)", r"e\1\2", f"{x:g}").replace("e+", "e")


def _synopsis(entry: Entry) -> str:
    """`pexec score STORE --out TEXT [OPTIONS]`: the arguments, the required options, then the rest."""
    words = ["pexec", *entry.words.split()]
    params = [p for p in entry.command.params if not getattr(p, "hidden", False)]
    for p in params:
        if p.param_type_name == "argument":
            name = p.name.upper() + ("…" if p.nargs == -1 else "")
            words.append(name if p.required else f"[{name}]")
    required = [p for p in params if isinstance(p, TyperOption) and p.required]
    words += [f"{p.opts[0]} {_kind(p, entry.context)}" for p in required]
    if any(p.param_type_name == "option" and not p.required for p in params):
        words.append("[OPTIONS]")
    if isinstance(entry.command, Group):
        words.append("COMMAND")
    return " ".join(words)


def cli_entry(entry: Entry) -> str:
    """A command's reference entry: heading, synopsis, what it does, and a table of its arguments and options
    (`--help`, which every command has, is left out)."""
    level = "#" * (2 + max(0, len(entry.words.split()) - 1))
    title = " ".join(["pexec", *entry.words.split()])
    lines = [f"{level} `{title}`", "", "```", _synopsis(entry), "```", ""]
    lines += [" ".join((entry.command.help or "").split()), ""]
    params = [p for p in entry.command.params if not getattr(p, "hidden", False)]
    if params:
        lines += ["| argument or option | value | default | meaning |", "|---|---|---|---|"]
        for p in params:
            meaning = getattr(p, "help", None) or ""  # options and arguments have it, click's base does not
            if p.envvar:
                meaning += f" Also read from `${p.envvar}`."
            cells = [f"`{_name(p)}`", _value(p, entry.context), _default(p), _cell(meaning) or "–"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if isinstance(entry.command, Group):
        lines += ["Commands:", ""]
        for name, sub in entry.command.commands.items():  # each a link to its entry's heading
            lines.append(f"- [`{title} {name}`](#{'-'.join([*title.split(), name])}): {_cell(sub.help or '')}")
        lines.append("")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def metric_parts() -> str:
    """The catalogue's per-rollout parts and how each ratio metric is made of them."""
    from pipeline.core import metric_catalogue as mc

    parts = _table(
        ["part", "per rollout", "SQL over `rollouts`"], [[f"`p_{p.name}`", p.doc, f"`{p.sql}`"] for p in mc.PARTS]
    )

    def ratio(m: mc.Metric) -> str:
        scale = f" / 2^{int(mc.AUC_UNIT).bit_length() - 1}" if m.scale == mc.AUC_UNIT else ""
        return f"Σ `p_{m.num}`{scale} / Σ `p_{m.den}`"

    metrics = _table(
        ["metric", "computed as", "ranked in the report", "paired comparison", "in the tables"],
        [
            [
                f"`{m.name}`",
                ratio(m),
                "yes" if m.ranked else "no",
                "yes" if m.paired else "no",
                "yes" if m.in_tables else "no",
            ]
            for m in mc.ratios()
        ],
    )
    return parts + "\n" + metrics


def tool_metrics() -> str:
    """The per-tool profile's fields and ratio metrics (`metrics --by tool`)."""
    from pipeline.metrics.tool_profiles import TOOL_FIELDS, TOOL_METRICS

    rows = [[f"`{m.name}`", m.label, f"Σ `{m.num}` / Σ `{m.den}` per task", m.doc] for m in TOOL_METRICS]
    table = _table(["metric", "label", "computed as", "what"], rows)
    return (
        table + "\nFields of a profile besides its cohort columns: " + ", ".join(f"`{f}`" for f in TOOL_FIELDS) + ".\n"
    )


# The command whose options a job file's table stands for ("": the top level, `pexec score`'s).
_JOB_COMMANDS = {"": "score", "metrics": "metrics", "report": "report", "diff": "diff", "synth": "synth"}


def _command(words: str) -> Entry:
    return next(e for e in commands() if e.words == words)


def job_option(table: str, key: str) -> Parameter | None:
    """The option (or argument) of the command a job file's `key` in `table` stands for: the command's parameter
    of that name, or the option that is the key with dashes (`[report] out` is `--out`)."""
    if table not in _JOB_COMMANDS:
        return None
    params = _command(_JOB_COMMANDS[table]).command.params
    flag = "--" + key.replace("_", "-")
    return next((p for p in params if p.name == key), None) or next((p for p in params if flag in p.opts), None)


def job_fields() -> str:
    """The job file's keys, each with the command-line option it stands for (FIELDS, the loader's declaration)."""
    from pipeline.apps.jobs.definition import FIELDS

    rows = []
    for f in FIELDS:
        found = [job_option(f.table, k) for k in f.keys]
        options = ", ".join(f"`{_name(p)}`" for p in found if p is not None) or "–"
        keys = (f"`[{f.table}]` " if f.table else "") + ", ".join(f"`{k}`" for k in f.keys)
        rows.append([keys, options, f.meaning, f.default])
    return _table(["field", "option", "meaning", "default"], rows)


def job_exclusions() -> str:
    """The `pexec score` options a job file has no key for, and why."""
    from pipeline.apps.jobs.definition import NOT_IN_JOB_FILES

    rows = []
    for name, why in NOT_IN_JOB_FILES.items():
        param = next(p for p in _command("score").command.params if p.name == name)
        rows.append([f"`{_name(param)}`", why])
    return _table(["`pexec score` option", "why a job file has no key for it"], rows)


def log_options() -> str:
    """Each format's `--option` keys, their defaults and meanings, as the format declares them (its
    `OptionSchema`, which `pexec ingest` checks options against)."""
    from pipeline.ingest import accepted_options, formats

    rows = []
    for fmt in formats():
        for o in accepted_options(fmt).listed():
            rows.append([f"`{fmt}`", f"`{o.key}`", f"`{o.default}`" if o.default else "–", _cell(o.doc)])
    return _table(["format", "key", "default", "meaning"], rows)


def environments() -> str:
    """The environments every installation has: built-in families and the spec folders shipped in specs/ (not
    those of entry points or of $PEXEC_SPEC_PATH, which differ between installations)."""
    from pipeline.envs import list_environments
    from pipeline.envs.data import BUILTIN_SPECS

    rows = []
    for name, source in list_environments().items():
        if source == "built-in":
            rows.append([f"`{name}`", "built-in"])
        elif source.startswith("spec ") and Path(source.removeprefix("spec ")).resolve().parent == BUILTIN_SPECS:
            rows.append([f"`{name}`", f"spec folder `specs/{name}/`"])
    return _table(["environment", "from"], rows)


def _signature(cls: type, name: str) -> str:
    """How a member of a plug-in class is written: `name: type` for a property (a plain attribute satisfies it),
    `name(param: type, ...) -> type` for a method, as its annotations are written."""
    member = inspect.getattr_static(cls, name)
    if isinstance(member, property) and member.fget is not None:
        return f"{name}: {inspect.signature(member.fget).return_annotation}"
    signature = inspect.signature(member)
    params = [
        p.name if p.annotation is p.empty else f"{p.name}: {p.annotation}"
        for p in signature.parameters.values()
        if p.name != "self"
    ]
    return f"{name}({', '.join(params)}) -> {signature.return_annotation}"


def plugin_members(cls: type, required: Iterable[str]) -> str:
    """Every member a plug-in class states (pipeline.core.plugins.declared), in its order: its signature, whether a
    plug-in must give it, and its docstring (which states the default of one it need not give)."""
    must = set(required)
    lines = []
    for name in declared(cls):
        doc = inspect.getdoc(inspect.getattr_static(cls, name)) or ""
        lines.append(f"- `{_signature(cls, name)}`{' (required)' if name in must else ''}: {_prose(doc)}")
    return "\n".join(lines) + "\n"


def log_format_members() -> str:
    """The members of a log format (pipeline.ingest.base.LogFormat), and what `ShardedFormat` changes."""
    from pipeline.ingest.base import LogFormat, ShardedFormat

    sharded = sorted(ShardedFormat.__abstractmethods__ - LogFormat.__abstractmethods__)
    return (
        plugin_members(LogFormat, LogFormat.__abstractmethods__)
        + f"\n`ShardedFormat` (required: {', '.join(f'`{m}`' for m in sharded)}): "
        + _prose(inspect.getdoc(ShardedFormat) or "")
        + "\n"
    )


def environment_members() -> str:
    """The members of an environment (pipeline.envs.base.Environment, a protocol: every one is required)."""
    from pipeline.envs.base import Environment

    return "Every member is required:\n\n" + plugin_members(Environment, ())


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"


# How limits.toml's `show` writes a value.
_SHOW: dict[str, Callable[[Any], str]] = {
    "count": lambda x: f"{x:,}",
    "size": _size,
    "number": _number,
    "power2": lambda x: f"2^-{int(x).bit_length() - 1}",
    "seconds": lambda x: f"{x:g} s",
    "text": str,
}


def _declared(where: str) -> tuple[Any, str]:
    """The value `module:NAME`, `module:Class.field` or `module:function(param)` names, and the file and name
    it is declared as."""
    module_name, _, name = where.partition(":")
    module = importlib.import_module(module_name)
    path = Path(module.__file__ or "").relative_to(Path(__file__).resolve().parents[3])
    if param := re.fullmatch(r"(\w+)\((\w+)\)", name):
        value = inspect.signature(getattr(module, param[1])).parameters[param[2]].default
    else:
        value = module
        for part in name.split("."):  # a dataclass field's default is its class attribute
            value = getattr(value, part)
    return value, f"{path} `{name}`"


def limits() -> str:
    """Every limit pipeline/apps/cli/limits.toml names, with its value as the code declares it."""
    rows = []
    for limit in tomllib.loads((Path(__file__).parent / "limits.toml").read_text(encoding="utf-8"))["limit"]:
        value, declared = _declared(limit["value"])
        shown = " ".join([_SHOW[limit.get("show", "count")](value), limit.get("unit", "")]).strip()
        rows.append([limit["what"], shown, declared])
    return _table(["limit", "value", "declared in"], rows)


def _builders() -> dict[tuple[str, str], Callable[[], str]]:
    """(page, block name) -> what writes the block."""
    from pipeline.core import metric_catalogue, run_folder, run_schema

    builders: dict[tuple[str, str], Callable[[], str]] = {}
    for entry in commands():
        builders[("cli.md", f"cli {entry.words}".strip())] = partial(cli_entry, entry)
    builders[("run-folder.md", "schema")] = run_schema.markdown
    builders[("run-folder.md", "files")] = run_folder.markdown
    builders[("metrics.md", "metrics")] = metric_catalogue.markdown
    builders[("metrics.md", "metric parts")] = metric_parts
    builders[("metrics.md", "tool metrics")] = tool_metrics
    builders[("jobs.md", "job fields")] = job_fields
    builders[("jobs.md", "score options not in jobs")] = job_exclusions
    builders[("log-formats.md", "options")] = log_options
    builders[("environments.md", "environments")] = environments
    builders[("limits.md", "limits")] = limits
    return builders


def _guide_builders() -> dict[tuple[Path, str], Callable[[], str]]:
    """(page, block name) -> what writes the block, for the guides that list a plug-in kind's members."""
    return {
        (GUIDES / "add-a-log-format.md", "log format"): log_format_members,
        (GUIDES / "add-an-environment.md", "environment"): environment_members,
    }


def expected() -> dict[Path, dict[str, str]]:
    """page (from the repository's root) -> block name -> the text the block should hold."""
    out: dict[Path, dict[str, str]] = {}
    builders = {(DOCS / page, name): build for (page, name), build in _builders().items()} | _guide_builders()
    for (page, name), build in builders.items():
        out.setdefault(page, {})[name] = build()
    return out


def blocks(text: str) -> dict[str, str]:
    """block name -> what a page holds between its markers."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(text)}


def problems(root: Path) -> list[str]:
    """What is stale, missing or unknown among the generated blocks of the pages under `root`."""
    found = []
    for page, wanted in expected().items():
        path = root / page
        have = blocks(path.read_text(encoding="utf-8")) if path.exists() else {}
        found += [f"{page}: no block {name!r}" for name in wanted if name not in have]
        found += [f"{page}: block {name!r} is stale" for name in wanted if name in have and have[name] != wanted[name]]
        found += [f"{page}: block {name!r} is generated by nothing" for name in have if name not in wanted]
    return found


def write(root: Path) -> list[str]:
    """Rewrite every block in place; the pages that changed."""
    changed = []
    for page, wanted in expected().items():
        path = root / page
        text = path.read_text(encoding="utf-8")
        new = BLOCK.sub(partial(_rewritten, wanted), text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(str(page))
    return changed


def _rewritten(wanted: dict[str, str], match: re.Match[str]) -> str:
    """A block as its builder writes it now, or as it stands when no builder knows its name."""
    return _block(match.group(1), wanted[match.group(1)]) if match.group(1) in wanted else match.group(0)


def _block(name: str, body: str) -> str:
    return f"<!-- generated:start {name} -->\n{body}<!-- generated:end {name} -->"


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[3]
    if argv == ["--check"]:
        stale = problems(root)
        print("\n".join(stale) or "every generated block is current")
        return 1 if stale else 0
    if argv:
        print("usage: python -m pipeline.apps.cli.reference [--check]", file=sys.stderr)
        return 2
    for page in write(root):
        print(f"rewrote {page}")
    left = problems(root)  # a block that is missing from its page cannot be rewritten: add its markers
    print("\n".join(left), file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
