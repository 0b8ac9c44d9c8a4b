"""The code blocks of the manual (``docs/``) and of README.md, found and checked.

How each language is checked is written for contributors in docs/development.md ("The
manual and its code blocks"): python runs, a console transcript runs and must print what it
shows, a command that cannot run here (a remote host) is parsed by the real CLI, and so on.
An HTML comment on the line above a fence gives a block its options:
``<!-- test: scenario=incident -->``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<lang>[\w-]*)[^\n`]*$")
OPTIONS = re.compile(r"^\s*<!--\s*test:(?P<options>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, its options."""

    path: Path
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    """README.md, every page of the manual, and benchmarks/README.md (which the manual's
    Performance page shows)."""
    docs = sorted((REPO / "docs").rglob("*.md"))
    return [REPO / "README.md", *docs, REPO / "benchmarks" / "README.md"]


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, ticks = opening["indent"], opening["ticks"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        assert end < len(lines), f"{path}:{i + 1}: a fence that is never closed"
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip()
            for line in lines[i + 1 : end]
        ]
        options: dict[str, str] = {}
        above = OPTIONS.match(lines[i - 1]) if i else None
        if above:
            options = dict(part.split("=", 1) for part in shlex.split(above["options"]))
        yield Block(path, i + 1, opening["lang"], "\n".join(body) + "\n", options)
        i = end + 1


def every_block() -> list[Block]:
    return [block for path in pages() for block in blocks(path)]


# -- shell commands -------------------------------------------------------------------------

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
EXIT = re.compile(r"#\s*exit (\d+)\b")


@dataclass(frozen=True)
class Command:
    """A shell line as a transcript shows it: what to run, the exit status it must give, and
    the output shown below it (a console block's lines up to the next ``$``)."""

    line: str
    exit: int
    output: tuple[str, ...]


def console(text: str) -> list[Command]:
    """The ``$`` commands of a console block, each with the lines shown below it."""
    commands: list[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        assert line.startswith("$ "), f"console output before any command: {line!r}"
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        output = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        code = EXIT.search(command)
        commands.append(Command(command, int(code[1]) if code else 0, tuple(output)))
    return commands


def script(text: str) -> list[str]:
    """The command lines of a bash block (continuations joined, comment lines dropped)."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    assert not pending, "a bash block ends in a continued line"
    return out


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line: split at pipes, ``&&``, ``||`` and ``;``,
    without redirections, comments and leading ``NAME=value`` assignments."""
    line = re.sub(r"(?<=\s)\d?>&\d", " ", line)  # 2>&1
    line = re.sub(r"(?<=\s)\d>", " >", line)  # 2>/dev/null
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("|", "&&", "||", ";", "&"):
            commands.append([])
        elif token in (">", ">>", "<", "&>"):
            i += 1  # and its target
        else:
            commands[-1].append(token)
        i += 1
    out = []
    for command in commands:
        words = list(command)
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words:
            out.append(words)
    return out


# -- loose comparison of a command's output ----------------------------------------------------

_LOOSE = [
    # a time: 2026-11-24T21:47:57.766000Z, 2026-11-24 21:47:27Z, 2026-11-24
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?Z?)?",
    # a duration: 41s, 1m11s, 2.4s, 7d28s, 350ms, 0.8 ms
    r"\b\d+(?:\.\d+)? ?(?:ms|µs|d|h|m|s)(?:\d+(?:\.\d+)?(?:ms|d|h|m|s))*\b",
    # a fencing token or a count of microseconds; a hex id
    r"\b\d{10,}\b",
    r"\b[0-9a-f]{8,}\b",
]
_TOKEN = re.compile("|".join(f"(?:{pattern})" for pattern in _LOOSE))


def loose(expected: str) -> re.Pattern[str]:
    """A pattern that ``expected`` (a line of shown output) matches, and so does the line
    printed at another moment: times, durations, tokens and column widths may differ."""
    out = []
    pos = 0
    for match in _TOKEN.finditer(expected):
        out.append(_spaced(expected[pos : match.start()]))
        out.append(next(p for p in _LOOSE if re.fullmatch(p, match[0])).replace("\\b", ""))
        pos = match.end()
    out.append(_spaced(expected[pos:]))
    return re.compile("".join(out))


def _spaced(text: str) -> str:
    """``text`` as a pattern in which runs of spaces and of box-drawing lines may be longer
    or shorter (column widths follow the values)."""
    parts = re.split(r"( +|[─━═]+)", text)
    out = []
    for part in parts:
        if not part:
            continue
        if part.startswith(" "):
            out.append(" +")
        elif part[0] in "─━═":
            out.append(f"{re.escape(part[0])}+")
        else:
            out.append(re.escape(part))
    return "".join(out)


def matches(shown: list[str], printed: list[str]) -> str | None:
    """Why ``printed`` is not what a transcript shows, or None when it is."""
    shown = [line.rstrip() for line in shown]
    printed = [line.rstrip() for line in printed]
    for n, (want, got) in enumerate(zip(shown, printed, strict=False)):
        if not loose(want).fullmatch(got):
            return f"line {n + 1}: shown {want!r}, printed {got!r}"
    if len(shown) != len(printed):
        return f"shown {len(shown)} lines, printed {len(printed)}:\n" + "\n".join(printed)
    return None
