#!/usr/bin/env python3
"""Derive idemctl's sync code from its async original, so it is written once.

Every piece of idemctl that exists for both sync and async callers is written once, for
asyncio (a store family's async half beside its sync one, ``*_async.py`` under
``idemctl/stores/``; the runner's under ``idemctl/aio/``; the HTTP middleware's attempt in
``idemctl/http/attempt_aio.py``): the stores' front (their callers' arguments checked),
the runner's attempt, ``@idempotent`` and a heartbeat's beat, the protocol's steps on
PostgreSQL and Redis, the Redis script runner, the PostgreSQL flows' driver, PostgreSQL's
transactional unit, the outbox writer, and the HTTP middleware's attempt. This script
writes their sync modules by removing ``async``/``await`` and renaming the async names
(``AsyncStore`` -> ``Store``, ...), then formats them with ruff. What they run has no I/O
and exists once (the Redis operations, the PostgreSQL flows, the script calls' plan). The
two heartbeats' schedules (a thread's scheduler, an event loop's timer) are each their
concurrency's own.

    scripts/unasync.py           write the sync modules
    scripts/unasync.py --check   exit 1, naming the files, when one differs from its original

Model: httpcore's ``scripts/unasync.py`` and psycopg's ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILES = {
    "idemctl/aio/attempt.py": "idemctl/runner/attempt.py",
    "idemctl/stores/postgres/unit_async.py": "idemctl/stores/postgres/unit.py",
    "idemctl/aio/outbox.py": "idemctl/outbox/writer.py",
    "idemctl/stores/postgres/steps_async.py": "idemctl/stores/postgres/steps.py",
    "idemctl/stores/postgres/drive_async.py": "idemctl/stores/postgres/drive.py",
    "idemctl/stores/redis/steps_async.py": "idemctl/stores/redis/steps.py",
    "idemctl/stores/redis/runner_async.py": "idemctl/stores/redis/runner.py",
    "idemctl/stores/front_async.py": "idemctl/stores/front.py",
    "idemctl/aio/decorator.py": "idemctl/runner/decorator.py",
    "idemctl/aio/beat.py": "idemctl/runner/beat.py",
    "idemctl/http/attempt_aio.py": "idemctl/http/attempt.py",
}
"""Each async original and the sync module written from it."""

MODULES = {
    "idemctl.aio": "idemctl.stores",
    "idemctl.aio.opening": "idemctl.stores",
    "idemctl.aio.attempt": "idemctl.runner.attempt",
    "idemctl.aio.context": "idemctl.runner.context",
    "idemctl.aio.beat": "idemctl.runner.beat",
    "idemctl.stores.front_async": "idemctl.stores.front",
    "idemctl.aio.heartbeat": "idemctl.runner.heartbeat",
    "idemctl.http.attempt_aio": "idemctl.http.attempt",
    "idemctl.aio.outbox": "idemctl.outbox.writer",
    "idemctl.stores.postgres.store_async": "idemctl.stores.postgres.store",
    "idemctl.stores.postgres.core_async": "idemctl.stores.postgres.core",
    "idemctl.stores.postgres.drive_async": "idemctl.stores.postgres.drive",
    "idemctl.stores.postgres.steps_async": "idemctl.stores.postgres.steps",
    "idemctl.stores.redis.core_async": "idemctl.stores.redis.core",
    "idemctl.stores.redis.connections_async": "idemctl.stores.redis.connections",
    "idemctl.stores.redis.runner_async": "idemctl.stores.redis.runner",
    "idemctl.stores.redis.steps_async": "idemctl.stores.redis.steps",
    "idemctl.stores.base_async": "idemctl.stores.base",
    "idemctl.stores.postgres.unit_async": "idemctl.stores.postgres.unit",
}

NAMES = {
    "AsyncClient": "Client",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncFront": "Front",
    "AsyncDirect": "Connections",
    "AsyncIterator": "Iterator",
    "AsyncOutbox": "Outbox",
    "AsyncPipeline": "Pipeline",
    "AsyncPostgresCore": "PostgresCore",
    "AsyncPostgresSteps": "PostgresSteps",
    "AsyncPostgresStore": "PostgresStore",
    "AsyncRedisCore": "RedisCore",
    "AsyncRedisSteps": "RedisSteps",
    "AsyncScriptRunner": "ScriptRunner",
    "AsyncStore": "Store",
    "AsyncTransactionalStore": "TransactionalStore",
    "AsyncUnit": "Unit",
    "asynccontextmanager": "contextmanager",
    "drive_async": "drive",
    "wait_async": "wait",
}
"""Whole words renamed, in code, comments and docstrings alike."""

SYNTAX: list[tuple[re.Pattern[str], str]] = [
    # A give-back shielded from a second cancellation is, in a thread, a plain call.
    (re.compile(r"await asyncio\.shield\((.*)\)$", re.M), r"\1"),
    # A pause between two tries is, in a thread, a plain sleep.
    (re.compile(r"await asyncio\.sleep\("), "time.sleep("),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\bAwaitable\[(\w+)\]"), r"\1"),
    (re.compile(r"\basync (def|with|for) "), r"\1 "),
]
WORDS = {**MODULES, **NAMES}
WORD = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(WORDS, key=len)[::-1]) + r")\b")


def unasync(text: str, original: str) -> str:
    """The sync module for the async ``text`` (from file ``original``), unformatted."""
    for pattern, replacement in SYNTAX:
        text = pattern.sub(replacement, text)
    text = WORD.sub(lambda m: WORDS[m.group(1)], text)
    text = text.replace(
        f"This module is the original of ``{_module(FILES[original])}`` (scripts/unasync.py).",
        f"Written by scripts/unasync.py from ``{_module(original)}``.",
    )
    header = (
        f"# Written by scripts/unasync.py from {original}.\n"
        "# Do not edit: change that file and run the script (scripts/test checks the two agree).\n"
    )
    return header + text


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def formatted(text: str, path: str) -> str:
    """``text`` as ruff leaves it: imports sorted, the unused ones gone, formatted."""
    ruff = [sys.executable, "-m", "ruff"]
    fixed = subprocess.run(  # noqa: S603 (ruff, on our own source)
        [*ruff, "check", "--fix-only", "--select", "I,F401", "--stdin-filename", path, "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return subprocess.run(  # noqa: S603
        [*ruff, "format", "--stdin-filename", path, "-"],
        input=fixed,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on drift, write nothing")
    args = parser.parse_args()
    drifted = []
    for original, derived in FILES.items():
        text = formatted(unasync((ROOT / original).read_text(), original), derived)
        target = ROOT / derived
        if args.check:
            if not target.exists() or target.read_text() != text:
                drifted.append(derived)
        elif not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {derived}")
    for derived in drifted:
        original = next(o for o, d in FILES.items() if d == derived)
        print(
            f"{derived} differs from what {original} gives: change {original}, not the "
            "sync copy, and run scripts/unasync.py",
            file=sys.stderr,
        )
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
