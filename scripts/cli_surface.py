#!/usr/bin/env python3
"""Write idemctl's surface, ``--help`` of every command and the ``--json`` documents of the
operator commands on one small SQLite store, to a JSON file, so that a renovation can show
it changed neither: run it on two checkouts and diff the files.

    PYTHONPATH=. python scripts/cli_surface.py /tmp/after.json
    (cd ../old && PYTHONPATH=. python scripts/cli_surface.py /tmp/before.json)

Timestamps, ids, durations and the store's path are masked, so that only a change of
wording, fields or exit codes shows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ENV = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
JSON_RUNS = [
    ("stats",), ("stats", "--exact"), ("list",), ("list", "--status", "failed"),
    ("list", "--entities"), ("inspect", "k-done"), ("inspect", "k-nope"), ("doctor",),
    ("unlock", "--stale"), ("purge", "--older-than", "0s"), ("forget", "k-failed"),
    ("version",), ("init",), ("unlock", "k-flight", "--yes"),
    ("purge", "--older-than", "0s", "--yes"), ("forget", "k-done", "--yes"),
]  # fmt: skip
MASKS = [
    (r"\d{4}-\d\d-\d\dT[\d:.+Z-]+", "TIME"),
    (r"[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{32}", "ID"),
    (r"\d+\.\d+", "N"),
    (r'"(owner|fencing_token)": \d+', r'"\1": N'),
]


def idemctl(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "idemctl", *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, check=False)  # noqa: S603


def helps(path: list[str], out: dict[str, str]) -> None:
    """``--help`` of the command at ``path`` and of every command under it."""
    text = idemctl(*path, "--help").stdout
    out[" ".join(path) or "(top)"] = text
    if "\nCommands:\n" in text:
        for line in text.split("\nCommands:\n", 1)[1].splitlines():
            if (m := re.match(r"^  (\S+)\s", line + " ")) is not None:
                helps([*path, m.group(1)], out)


def documents(folder: Path) -> dict[str, dict[str, object]]:
    """The ``--json`` documents, exit codes and errors of ``JSON_RUNS`` on a fresh store
    with a completed, a failed, a held and an expired key."""
    from idemctl import open_store

    url = f"sqlite:///{folder / 'keys.db'}"
    with open_store(url) as s:
        done = s.claim("k-done", lease=600)
        s.complete("k-done", done.owner, done.fencing_token, {"ok": 1})  # type: ignore[union-attr]
        failed = s.claim("k-failed", lease=600)
        s.fail("k-failed", failed.owner, failed.fencing_token, "boom", retriable=False)  # type: ignore[union-attr]
        s.claim("k-flight", lease=600)
    out: dict[str, dict[str, object]] = {}
    for args in JSON_RUNS:
        r = idemctl("--store", url, "--json", *args)
        texts = [r.stdout.replace(str(folder), "DIR"), r.stderr.replace(str(folder), "DIR")]
        for pattern, mask in MASKS:
            texts = [re.sub(pattern, mask, t) for t in texts]
        out[" ".join(args)] = {"exit": r.returncode, "stdout": texts[0], "stderr": texts[1]}
    return out


def main() -> None:
    help_texts: dict[str, str] = {}
    helps([], help_texts)
    with tempfile.TemporaryDirectory() as folder:
        docs = documents(Path(folder))
    Path(sys.argv[1]).write_text(json.dumps({"help": help_texts, "json": docs}, indent=1))


if __name__ == "__main__":
    main()
