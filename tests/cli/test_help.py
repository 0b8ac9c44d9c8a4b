"""Every command's --help reads well on the typer installed: each option that takes a value
names it (``--store URL``), flags show nothing beside them, and no type tag (typer 0.28 and
later: ``<str>``, ``<bool>``; earlier: ``TEXT``, ``BOOLEAN``) stands in for a name. CI runs
this on the newest typer allowed and on the lowest."""

from __future__ import annotations

import re
from collections.abc import Iterator

import typer.main

from idemctl.cli import app
from idemctl.cli.lazy import load_all
from tests.cli.helpers import run

NOISE = re.compile(
    r"<(?:bool|str|int|float|path|datetime|uuid|list\[[^\]]*\]|[a-z]+ range)>"
    r"|\b(?:TEXT|BOOLEAN|INTEGER|FLOAT|PATH)\b"
)


def command_paths(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from command_paths(sub, (*path, name))


load_all()
PATHS = list(command_paths(typer.main.get_command(app)))


def test_every_command_is_reached() -> None:
    names = {" ".join(p) for p in PATHS}
    assert {"", "consume", "unlock", "verify", "outbox", "outbox relay"} <= names
    assert len(PATHS) >= 17


def test_no_help_shows_a_type_tag_instead_of_a_name() -> None:
    noisy = {}
    for path in PATHS:
        shown = run([*path, "--help"])
        assert shown.exit_code == 0, (path, shown.output)
        assert "Usage: idemctl" in shown.output
        lines = [line.strip() for line in shown.output.splitlines() if NOISE.search(line)]
        if lines:
            noisy[" ".join(("idemctl", *path))] = lines
    assert noisy == {}


def test_flags_show_no_metavar_and_values_show_their_name() -> None:
    shown = run(["unlock", "--help"]).output
    assert re.search(r"--force +Free a live lease", shown)
    assert re.search(r"--older-than DUR +With --stale", shown)
    assert re.search(r"--store URL +Store URL", shown)
    assert re.search(r"-h, --help +Show this message", shown)
    assert shown.index("Options:") < shown.index("  --force") < shown.index("Global options:")
    assert shown.index("Global options:") < shown.index("--store URL")
    assert re.search(r"Usage: idemctl unlock \[OPTIONS\] \[?KEY\]?", shown)  # [KEY] on typer 0.26+
    root = run(["--help"]).output
    assert re.search(r"--json +Print one JSON document", root)
    assert re.search(r"-v, --verbose +Log to stderr", root)


def test_the_noise_pattern_catches_what_typer_prints_without_names() -> None:
    assert NOISE.search("│ --force   <bool>  Free a live lease")
    assert NOISE.search("│ --store   <str>   Store URL")
    assert NOISE.search("│ --topic   <list[str]>  Topic")
    assert NOISE.search("│ --limit   <int range> [x>=0]")
    assert NOISE.search("│ --store   TEXT    Store URL")
    assert not NOISE.search("│ --log-format  <auto|json|logfmt|text>  Log lines")
    assert not NOISE.search("│ --lease   DUR     Lease per claim")
