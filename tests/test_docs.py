"""The README is tested against the code: every command is documented, every documented option exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer.main
from typer.core import TyperGroup

from pipeline.cli import app
from pipeline.core import metric_catalogue
from pipeline.core.run_schema import markdown, tables
from pipeline.envs.spec.loader import load_spec

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
# "name" or "group sub" (a sub-app's commands, e.g. "guard serve") -> the click command
COMMANDS = {
    f"{cmd.name} {sub}" if sub else cmd.name: command
    for cmd in typer.main.get_command(app).commands.values()
    for sub, command in (cmd.commands.items() if isinstance(cmd, TyperGroup) else [(None, cmd)])
}


def documented_invocations() -> list[list[str]]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        lines += [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("pexec ")]
    headings = re.findall(r"^### `(pexec [^`]*)`", README, re.M)
    return lines + [h.replace("|", " ").replace("[", " ").replace("]", " ").split() for h in headings]


def test_every_command_has_a_section():
    for name in COMMANDS:
        assert f"### `pexec {name}" in README, f"README has no section for `pexec {name}`"


def test_documented_commands_and_options_exist():
    invocations = documented_invocations()
    assert len(invocations) >= 10
    for words in invocations:
        name = words[1] if words[1] in COMMANDS else " ".join(words[1:3])
        assert name in COMMANDS, f"README uses unknown command {name!r}"
        options = {opt for param in COMMANDS[name].params for opt in param.opts}
        arguments = words[1 + len(name.split()) :]
        for word in arguments[: arguments.index("--") if "--" in arguments else None]:  # `--`: another program's
            if word.startswith("--"):
                assert word.split("=")[0] in options, f"`pexec {name}` has no option {word}"


def test_the_spec_example_in_the_readme_compiles(tmp_path):
    example = re.search(r"```toml\n(.*?)```", README, re.S).group(1)
    shop = Path(__file__).resolve().parents[1] / "specs" / "shop"
    (tmp_path / "spec.toml").write_text(example)
    (tmp_path / "tools.json").write_text((shop / "tools.json").read_text())
    (tmp_path / "initial_state.json").write_text((shop / "initial_state.json").read_text())
    spec = load_spec(tmp_path)
    assert [e.op for e in spec.tools["cancel_order"].effects] == ["set", "set", "append", "delete"]


def test_the_output_tables_in_the_readme_are_the_schema():
    """The README's run tables are pipeline.core.run_schema's, column for column (regenerate the block between the
    markers with `python -c "from pipeline.core.run_schema import markdown; print(markdown())"`)."""
    block = re.search(r"<!-- schema:start -->\n(.*?)<!-- schema:end -->", README, re.S)
    assert block is not None, "README lacks the schema block"
    assert block.group(1) == markdown()
    for table in tables():
        assert f"**`{table.path}`**" in block.group(1)


def test_the_metrics_table_in_the_readme_is_the_catalogue():
    """Each metric's population and interval method, as the catalogue states them (regenerate the block with
    `python -c "from pipeline.core.metric_catalogue import markdown; print(markdown())"`)."""
    block = re.search(r"<!-- metrics:start -->\n(.*?)<!-- metrics:end -->", README, re.S)
    assert block is not None, "README lacks the metrics block"
    assert block.group(1) == metric_catalogue.markdown()


def test_the_benchmark_tables_in_the_readme_have_the_bench_format():
    """One block per `pexec bench` subcommand, as `pexec bench NAME --readme README.md` writes it (its shape,
    not its numbers): a caption, then figure | runs | project | baseline | ratio rows."""
    from pipeline.cli.main import BENCHES
    from pipeline.perf import figures

    blocks = figures.blocks(README)
    assert sorted(blocks) == sorted(BENCHES)
    for name, block in blocks.items():
        caption, blank, header, rule, *rows = block.splitlines()
        assert caption.startswith("_") and caption.endswith("_") and blank == "", name
        assert header == "| " + " | ".join(figures.HEADER) + " |" and rule == "|" + "---|" * 5, name
        assert rows, f"bench {name}: no figures"
        for row in rows:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
            assert len(cells) == 5 and cells[1].isdigit(), row
            assert cells[3].startswith("none") or cells[3].endswith(")"), row  # a baseline names itself or says why not
            assert cells[4] == "–" or cells[4].endswith("×"), row
