"""The CLI imports a command's module only when that command runs: ``--version``, ``--help``
and completing the command names import none, a command imports its own. Each check runs
``idemctl`` in a fresh interpreter and reads ``sys.modules`` after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from idemctl.cli import app
from idemctl.cli.lazy import COMMANDS, load_all

ROOT = Path(__file__).resolve().parents[2]
COMMAND_MODULES = {module for module, _ in COMMANDS.values()} - {"idemctl.cli"}
HEAVY = {"idemctl.model", "idemctl.stores", "idemctl.runner", "idemctl.consume", "confluent_kafka"}
"""What the CLI's start must not import: the protocol, the stores, the Kafka client."""

RUN_AND_LIST = """
import json, sys
sys.argv = ["idemctl", *json.loads(sys.argv[1])]
from idemctl.cli import main
try:
    main()
except SystemExit:
    pass
sys.__stderr__.write("\\n" + json.dumps(sorted(sys.modules)) + "\\n")
"""


def loaded_by(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules ``idemctl ARGS`` had imported by its end."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["version"]], ids=" ".join)
def test_the_start_imports_no_command_module(args: list[str]) -> None:
    loaded = loaded_by(*args)
    assert not loaded & (COMMAND_MODULES | HEAVY), sorted(loaded & (COMMAND_MODULES | HEAVY))


def test_a_command_imports_its_own_module_only() -> None:
    loaded = loaded_by("stats", "--help")
    assert "idemctl.cli.look" in loaded
    # look shows Powertools tables too (layout=powertools): that module, no other.
    others = COMMAND_MODULES - {"idemctl.cli.look", "idemctl.cli.powertools"}
    assert not loaded & (others | {"confluent_kafka"}), sorted(loaded & others)


def test_completing_command_names_imports_no_command_module() -> None:
    env = {"_IDEMCTL_COMPLETE": "complete_bash", "COMP_WORDS": "idemctl st", "COMP_CWORD": "1"}
    assert not loaded_by(env=env) & COMMAND_MODULES


def test_completion_reaches_every_command_and_its_options() -> None:
    def complete(words: str, at: int) -> list[str]:
        env = {"_IDEMCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(at)}
        done = subprocess.run(
            [sys.executable, "-m", "idemctl"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
            env={**os.environ, **env},
        )
        return done.stdout.split()

    assert set(complete("idemctl ", 1)) >= set(COMMANDS)
    assert "--exact" in complete("idemctl stats --ex", 2)
    assert complete("idemctl outbox re", 2) == ["relay", "replay"]


def test_the_index_names_every_command_its_module_and_summary() -> None:
    """COMMANDS is what --help lists before any module is imported: it must say what the
    commands themselves say."""
    load_all()
    built: Any = typer.main.get_command(app)
    assert list(built.commands) == list(COMMANDS) or set(built.commands) == set(COMMANDS)
    for name, command in built.commands.items():
        module, summary = COMMANDS[name]
        callback = command.callback
        if hasattr(command, "commands"):  # a group: its commands live in its module
            callback = next(iter(command.commands.values())).callback
        assert callback.__module__ == module, name
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert first == summary, name


def test_help_lists_every_command_with_its_summary() -> None:
    from tests.cli.helpers import run

    shown = " ".join(run(["--help"]).stdout.replace("│", " ").split())
    for name, (_, summary) in COMMANDS.items():
        assert f"{name} {' '.join(summary.split()[:4])}" in shown, name
