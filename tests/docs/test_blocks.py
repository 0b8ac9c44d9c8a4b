"""Every code block of the manual (``docs/``) and of README.md, checked by its language
(tests/docs/blocks.py finds them; docs/development.md says what each language gets)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs.blocks import (
    REPO,
    Block,
    console,
    every_block,
    matches,
    script,
    simple_commands,
)
from tests.docs.scenarios import SCENARIOS

BLOCKS = every_block()
BIN = Path(sys.executable).parent


def by_lang(*langs: str) -> list[Any]:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang in langs]


def test_every_block_has_a_language_the_tests_check() -> None:
    known = {
        "python",
        "console",
        "bash",
        "sh",
        "yaml",
        "dockerfile",
        "json",
        "mermaid",
        "cron",
        "promql",
    }
    unknown = [f"{b.where} ({b.lang or 'no language'})" for b in BLOCKS if b.lang not in known]
    assert not unknown, f"blocks no test checks: {unknown}"
    options = {"scenario", "tested-by"}
    odd = [f"{b.where} ({', '.join(b.options)})" for b in BLOCKS if set(b.options) - options]
    assert not odd, f"options no test reads: {odd}"
    assert len([b for b in BLOCKS if "docs" in b.path.parts]) > 40  # the manual was found


# -- idemctl command lines, parsed by the real CLI ------------------------------------------


def parse_idemctl(args: list[str]) -> None:
    """Parse ``idemctl ARGS`` as the CLI would (command, options, values) without running
    it: a misspelt option or a wrong value fails. Through typer's click, whichever it is
    (recent typers carry their own), so by duck typing."""
    import typer

    from idemctl.cli import app

    command: Any = typer.main.get_command(app)
    name = "idemctl"
    rest = list(args)
    while True:
        try:
            ctx = command.make_context(name, rest)
        except Exception as exc:
            if type(exc).__name__ == "Exit":  # --help, --version
                return
            raise AssertionError(f"idemctl {' '.join(args)}: {exc}") from exc
        if not hasattr(command, "resolve_command"):
            return
        protected = getattr(ctx, "_protected_args", None)
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        if not rest:
            return
        try:
            name, command, rest = command.resolve_command(ctx, rest)
        except Exception as exc:
            raise AssertionError(f"idemctl {' '.join(args)}: {exc}") from exc


def check_line(line: str) -> None:
    """A shell line of a block that is not run here: its idemctl commands are parsed, its
    ``pip install`` extras must exist."""
    for argv in simple_commands(line):
        program = Path(argv[0]).name
        if program == "idemctl":
            parse_idemctl(argv[1:])
        elif program in ("pip", "pipx", "pip3") and "install" in argv:
            check_extras(argv)
        elif program.startswith("python") and argv[1:2] and argv[1].endswith(".py"):
            assert (REPO / argv[1]).is_file(), f"{line}: no script {argv[1]}"


def check_extras(argv: list[str]) -> None:
    import tomllib

    extras = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    for arg in argv:
        match = re.search(r"\[([\w,-]+)\]", arg)
        if match and ("idemctl" in arg or arg.startswith((".", "dist/", "'.", "/"))):
            wanted = set(match[1].split(","))
            assert wanted <= extras, f"{arg}: no extra {sorted(wanted - extras)}"


@pytest.mark.parametrize("block", by_lang("bash", "sh", "cron"))
def test_shell_block_commands_parse(block: Block) -> None:
    for line in script(block.text):
        check_line(line.split(None, 5)[5] if block.lang == "cron" else line)


def run_by_another_test(block: Block) -> bool:
    """Whether ``block`` names the test that runs it (``tested-by=PATH::NAME``: a long run
    such as verify's, or a block whose effects a test of its own checks); that test must
    exist."""
    tested_by = block.options.get("tested-by")
    if tested_by:
        path, _, name = tested_by.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(), f"{block.where}: no test {tested_by}"
    return tested_by is not None


@pytest.mark.parametrize(
    "block", [p for p in by_lang("console") if not p.values[0].options.get("scenario")]
)
def test_console_block_commands_parse(block: Block) -> None:
    commands = console(block.text)
    if not run_by_another_test(block):
        shown = [c.line for c in commands if c.output]
        assert not shown, f"{block.where}: output shown for {shown} without a scenario to run it in"
    for command in commands:
        check_line(command.line)


# -- transcripts, run ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "block", [p for p in by_lang("console") if p.values[0].options.get("scenario")]
)
def test_console_transcript_prints_what_it_shows(block: Block, tmp_path: Path) -> None:
    SCENARIOS[block.options["scenario"]](tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
    env.update(COLUMNS="100", NO_COLOR="1", TERM="dumb", PATH=f"{BIN}{os.pathsep}{env['PATH']}")
    for command in console(block.text):
        proc = subprocess.run(
            ["bash", "-c", command.line],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        stderr = proc.stderr.splitlines()
        if stderr and stderr[0].startswith("store: "):
            stderr = stderr[1:]
        printed = proc.stdout.splitlines() + stderr
        assert proc.returncode == command.exit, (
            f"{block.where}: `{command.line}` exited {proc.returncode}, not {command.exit}:\n"
            + "\n".join(printed)
        )
        why = matches(list(command.output), printed)
        assert why is None, f"{block.where}: `{command.line}`: {why}"


# -- python, run ---------------------------------------------------------------------------


@pytest.mark.parametrize("block", by_lang("python"))
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block checks itself (``assert``), or names the test that runs it and reads back
    what it did (against the real PostgreSQL or broker it needs)."""
    if run_by_another_test(block):
        return
    monkeypatch.chdir(tmp_path)  # the default store, sqlite:///./idemctl.db, lands here
    for name in [k for k in os.environ if k.startswith("IDEMCTL_")]:
        monkeypatch.delenv(name)
    # dont_inherit: as a user's script runs, not under this file's __future__ imports
    exec(compile(block.text, block.where, "exec", dont_inherit=True), {"__name__": "__docs__"})


# -- data, diagrams, queries ---------------------------------------------------------------


@pytest.mark.parametrize("block", by_lang("yaml"))
def test_yaml_block_is_valid(block: Block) -> None:
    import jsonschema

    schema = json.loads((REPO / "schemas" / "config.schema.json").read_text())
    for doc in yaml.safe_load_all(block.text):
        if isinstance(doc, dict) and {"store", "kafka", "profiles"} & set(doc):
            jsonschema.validate(doc, schema)
        else:
            for argv in _lists(doc):
                if argv and argv[0] == "idemctl":
                    parse_idemctl([str(a) for a in argv[1:]])


def _lists(doc: Any) -> list[list[Any]]:
    """Every list in a YAML document, a container's command and args joined."""
    found: list[list[Any]] = []
    if isinstance(doc, dict):
        if isinstance(doc.get("command"), list):
            found.append(doc["command"] + list(doc.get("args") or []))
        for key, value in doc.items():
            if key not in ("command", "args"):
                found += _lists(value)
    elif isinstance(doc, list):
        found.append(doc)
        for item in doc:
            found += _lists(item)
    return found


@pytest.mark.parametrize("block", by_lang("dockerfile"))
def test_dockerfile_commands_parse(block: Block) -> None:
    for line in script(block.text):
        instruction, _, rest = line.partition(" ")
        if instruction in ("CMD", "ENTRYPOINT") and rest.startswith("["):
            argv = json.loads(rest)
            if argv[0] == "idemctl":
                parse_idemctl(argv[1:])
        elif instruction == "RUN":
            check_line(rest)


def test_json_blocks_parse() -> None:
    for block in BLOCKS:
        if block.lang == "json":
            json.loads(block.text)


@pytest.mark.parametrize("block", by_lang("mermaid"))
def test_mermaid_block_is_a_diagram_kind(block: Block) -> None:
    first = block.text.strip().splitlines()[0].strip()
    assert re.fullmatch(r"stateDiagram-v2|sequenceDiagram|flowchart (LR|TD)", first), first


def exported_metrics() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "idemctl").rglob("*.py"):
        names |= set(re.findall(r"\"(idemctl_[a-z_]+)\"", path.read_text()))
    return names


@pytest.mark.parametrize("block", by_lang("promql"))
def test_promql_names_metrics_idemctl_exports(block: Block) -> None:
    known = exported_metrics()
    for name in re.findall(r"\bidemctl_[a-z_]+", block.text):
        base = re.sub(r"_(total|bucket|count|sum|created|info)$", "", name)
        assert name in known or base in known, f"{block.where}: idemctl exports no {name}"
